// Shared by the rope prologue (rope_cache.cu) and the fused rope + decode attention
// (attention_rope_decode.cu): per-head RMSNorm and rotary of one head through a scratch row.
// Include after common.cuh (the source inliner does not deduplicate includes).
#pragma once

struct RopeArgs {
  int num_heads, num_kv_heads, head_dim, rotary_dim, is_neox;
  float eps, inv_kv_scale;
};

// Normalise (optional) and rotate one head of `src` into `dst`; scratch holds head_dim floats.
// Norm weights N are T or float (Qwen3.5 keeps its zero-centred q/k norms in float32).
template <typename T, typename C, typename N>
__device__ void rope_head(C* dst, const T* src, const N* norm, const float* cs, float* scratch,
                          const RopeArgs& a, bool rotate, float out_scale) {
  int lane = threadIdx.x & 31, D = a.head_dim;
  float ss = 0.f;
  for (int i = lane; i < D; i += 32) { float v = to_f32(src[i]); scratch[i] = v; ss += v * v; }
  if (norm) {
    float inv = rsqrtf(warp_sum(ss) / D + a.eps);
    __syncwarp();
    for (int i = lane; i < D; i += 32)
      scratch[i] = to_f32(from_f32<T>(scratch[i] * inv * to_f32(norm[i])));
  }
  __syncwarp();
  int half = a.rotary_dim / 2;
  for (int i = lane; i < D; i += 32) {
    float v = scratch[i];
    if (rotate && i < a.rotary_dim) {
      int j = a.is_neox ? (i < half ? i : i - half) : i / 2;
      bool first = a.is_neox ? i < half : (i & 1) == 0;
      int partner = a.is_neox ? (first ? i + half : i - half) : (first ? i + 1 : i - 1);
      float c = cs[j], s = cs[half + j], p = scratch[partner];
      v = first ? v * c - p * s : v * c + p * s;
    }
    dst[i] = from_f32<C>(v * out_scale);
  }
  __syncwarp();
}
