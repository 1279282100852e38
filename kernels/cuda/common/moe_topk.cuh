// Warp top-k of one token's router logits, shared by moe_decode.cu and moe_stream.cu.
#pragma once
// Needs common.cuh included before it (the NVRTC inliner has no include guards).

__device__ __forceinline__ float ms_ldcg(const float* p) {  // L2: another block may have written it
  float v;
  asm volatile("ld.global.cg.f32 %0, [%1];\n" : "=f"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ u32 ms_max_u32(u32 v) {
#if __CUDA_ARCH__ >= 800
  asm volatile("redux.sync.max.u32 %0, %0, 0xffffffff;\n" : "+r"(v));
#else
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
#endif
  return v;
}
__device__ __forceinline__ u32 ms_min_u32(u32 v) {
#if __CUDA_ARCH__ >= 800
  asm volatile("redux.sync.min.u32 %0, %0, 0xffffffff;\n" : "+r"(v));
#else
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = min(v, __shfl_xor_sync(0xffffffffu, v, o));
#endif
  return v;
}

// Top-k of one token's logits by a warp (PL experts per lane, E <= 32 * PL): descending
// weights, ties to the lower expert, like atlas_core.ops.moe.moe_route. Scores are >= 0, so
// their bits order as unsigned keys; key 0 marks a taken (or absent) expert.
template <int PL>
__device__ void ms_topk(float* weights, int* ids, const float* lg, int E, int top_k, int renorm,
                        int sigmoid) {
  int lane = threadIdx.x & 31;
  u32 key[PL];
  float mx = NEG_INF;
#pragma unroll
  for (int i = 0; i < PL; i++) {
    int e = lane + 32 * i;
    float v = e < E ? ms_ldcg(lg + e) : NEG_INF;
    key[i] = __float_as_uint(v);
    mx = fmaxf(mx, v);
  }
  mx = warp_max(mx);
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < PL; i++) {
    float v = __uint_as_float(key[i]);
    float s = sigmoid ? 1.f / (1.f + expf(-v)) : expf(v - mx);
    bool ok = lane + 32 * i < E;
    sum += ok ? s : 0.f;
    key[i] = ok ? __float_as_uint(s) + 1u : 0u;
  }
  sum = sigmoid ? 1.f : warp_sum(sum);
  float my_w = 0.f;
  int my_id = 0;
  for (int j = 0; j < top_k; j++) {
    u32 best = 0u;
    int bi = 0;
#pragma unroll
    for (int i = 0; i < PL; i++)
      if (key[i] > best) { best = key[i]; bi = i; }
    u32 top = ms_max_u32(best);
    u32 idx = ms_min_u32(best == top ? (u32)(lane + 32 * bi) : 0xffffffffu);
#pragma unroll
    for (int i = 0; i < PL; i++)
      if ((u32)(lane + 32 * i) == idx) key[i] = 0u;
    if (lane == j) { my_w = __uint_as_float(top - 1u) / sum; my_id = (int)idx; }
  }
  float chosen = warp_sum(lane < top_k ? my_w : 0.f);
  if (lane < top_k) {
    weights[lane] = renorm ? my_w / chosen : my_w;
    ids[lane] = my_id;
  }
}
