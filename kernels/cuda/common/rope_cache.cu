// Attention prologue: per-head RMSNorm of q/k, rotary embedding, KV-cache write.
// Grid (token, head group); each warp handles one head at a time through a shared scratch row.
#include "common.cuh"
#include "rope_common.cuh"

// q/k/v sources with per-token strides; k/v go to the paged cache when slot_mapping is given,
// else to dense [num_tokens, num_kv_heads, head_dim] outputs (rotary_embedding op).
// C is the cache element type (T, or fp8 for a float8_e4m3fn cache).
// VN: the value heads are RMS-normed with v_norm too (never rotated; Gemma-4).
template <typename T, typename C, typename N, bool VN = false>
__device__ void rope_qkv_impl(T* q_out, C* k_out, C* v_out, const T* q, const T* k, const T* v,
                              long long q_stride, long long k_stride, long long v_stride,
                              const int* positions, const float* cos_sin, const int* slots,
                              const N* q_norm, const N* k_norm, RopeArgs a,
                              const N* v_norm = nullptr) {
  extern __shared__ float rope_scratch[];
  pdl_trigger();  // launched with PDL after the qkv GEMV: wait for its output before reading
  pdl_wait();
  int t = blockIdx.x, warp = threadIdx.x >> 5, nwarps = (blockDim.x >> 5) * gridDim.y;
  int H = a.num_heads, KH = a.num_kv_heads, D = a.head_dim;
  const float* cs = cos_sin + (long long)positions[t] * a.rotary_dim;
  long long slot = slots ? slots[t] : t;
  float* scratch = rope_scratch + warp * D;
  int total = H + KH + (v ? KH : 0);
  for (int h = blockIdx.y * (blockDim.x >> 5) + warp; h < total; h += nwarps) {
    if (h < H) {
      rope_head<T, T, N>(q_out + ((long long)t * H + h) * D, q + t * q_stride + h * D, q_norm, cs,
                      scratch, a, true, 1.f);
    } else if (slot >= 0) {
      int kh = (h - H) % KH;
      bool is_k = h < H + KH;
      const T* src = is_k ? k + t * k_stride + kh * D : v + t * v_stride + kh * D;
      C* dst = (is_k ? k_out : v_out) + (slot * KH + kh) * D;
      rope_head<T, C, N>(dst, src, is_k ? k_norm : (VN ? v_norm : (const N*)0), cs, scratch, a, is_k,
                      slots ? a.inv_kv_scale : 1.f);
    }
  }
}

// reshape_and_cache: copy k/v rows [num_tokens, kv_heads*head_dim] into cache slots.
template <typename T, typename C>
__device__ void reshape_and_cache_impl(C* k_cache, C* v_cache, const T* k, const T* v,
                                       const int* slots, int row, float inv_scale) {
  pdl_trigger();
  pdl_wait();
  long long slot = slots[blockIdx.x];
  if (slot < 0) return;
  for (int i = threadIdx.x; i < row; i += blockDim.x) {
    k_cache[slot * row + i] = from_f32<C>(to_f32(k[(long long)blockIdx.x * row + i]) * inv_scale);
    v_cache[slot * row + i] = from_f32<C>(to_f32(v[(long long)blockIdx.x * row + i]) * inv_scale);
  }
}

// Kernel names: rope_qkv[_vn][_fp8][_nf32]_<dtype>, reshape_and_cache[_fp8]_<dtype> (_vn: the
// value heads normed too; _fp8: the cache is float8_e4m3fn; _nf32: norm weights in float32).
#define ROPE_ONE(T, S, C, N, NAME)                                                            \
  extern "C" __global__ void NAME##_##S(T* qo, C* ko, C* vo, const T* q, const T* k,         \
                                        const T* v, long long qs, long long ks, long long vs,  \
                                        const int* pos, const float* cs, const int* slots,     \
                                        const N* qn, const N* kn, int H, int KH, int D,        \
                                        int rot, int neox, float eps, float inv) {             \
    RopeArgs a{H, KH, D, rot, neox, eps, inv};                                                \
    rope_qkv_impl<T, C, N>(qo, ko, vo, q, k, v, qs, ks, vs, pos, cs, slots, qn, kn, a);      \
  }
#define ROPE_VN_ONE(T, S, C, N, NAME)                                                         \
  extern "C" __global__ void NAME##_##S(T* qo, C* ko, C* vo, const T* q, const T* k,         \
                                        const T* v, long long qs, long long ks, long long vs,  \
                                        const int* pos, const float* cs, const int* slots,     \
                                        const N* qn, const N* kn, const N* vn, int H, int KH,  \
                                        int D, int rot, int neox, float eps, float inv) {      \
    RopeArgs a{H, KH, D, rot, neox, eps, inv};                                                \
    rope_qkv_impl<T, C, N, true>(qo, ko, vo, q, k, v, qs, ks, vs, pos, cs, slots, qn, kn, a,  \
                                 vn);                                                         \
  }
#define CACHE_ONE(T, S, C, NAME)                                                              \
  extern "C" __global__ void NAME##_##S(C* kc, C* vc, const T* k, const T* v,                \
                                        const int* slots, int row, float inv) {                \
    reshape_and_cache_impl<T, C>(kc, vc, k, v, slots, row, inv);                              \
  }
#define ROPE(T, S)                                                                            \
  ROPE_ONE(T, S, T, T, rope_qkv) ROPE_ONE(T, S, T, float, rope_qkv_nf32)                      \
  ROPE_ONE(T, S, fp8, T, rope_qkv_fp8) ROPE_ONE(T, S, fp8, float, rope_qkv_fp8_nf32)          \
  ROPE_VN_ONE(T, S, T, T, rope_qkv_vn) ROPE_VN_ONE(T, S, T, float, rope_qkv_vn_nf32)          \
  ROPE_VN_ONE(T, S, fp8, T, rope_qkv_vn_fp8) ROPE_VN_ONE(T, S, fp8, float, rope_qkv_vn_fp8_nf32) \
  CACHE_ONE(T, S, T, reshape_and_cache) CACHE_ONE(T, S, fp8, reshape_and_cache_fp8)
INSTANTIATE(ROPE)
