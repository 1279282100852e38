// atlas-minimax: moe_route_biased (reference atlas_minimax.routing.moe_route_biased). Per
// token: s = sigmoid(logit) in float32; the top_k experts by s + bias (ties: lower expert
// first), weighted by s, divided by their sum when renorm.
//
// A warp per token (E <= 1024, top_k <= 32): lane l holds the biased scores of experts l, l + 32,
// ... in registers; each pick is the lane's best untaken score, then a warp argmax by shuffles
// (larger score, then lower expert). 256 experts top-8 take a few microseconds; the first version,
// a thread scanning every expert once per pick, cost ~280 us a decode step on an H200.
#include "common.cuh"

#define ROUTE_WARPS 4
#define ROUTE_MAX_PER_LANE 32  // 1024 experts / 32 lanes

template <typename T>
__device__ void moe_route_biased_impl(float* weights, int* ids, const T* logits,
                                      const float* bias, int ntok, int E, int top_k, int renorm) {
  pdl_wait();
  pdl_trigger();  // the experts kernel may start its launch; its own wait still sees our writes
  const int lane = threadIdx.x & 31;
  const int t = blockIdx.x * ROUTE_WARPS + (threadIdx.x >> 5);
  if (t >= ntok) return;
  const T* row = logits + (long long)t * E;
  float c[ROUTE_MAX_PER_LANE];
  unsigned taken = 0u;  // bit i: expert lane + 32 i already picked (or absent)
#pragma unroll
  for (int i = 0; i < ROUTE_MAX_PER_LANE; i++) {
    int e = lane + 32 * i;
    if (e < E) {
      float s = 1.f / (1.f + expf(-to_f32(row[e])));
      c[i] = s + bias[e];
    } else {
      c[i] = 0.f;
      taken |= 1u << i;
    }
  }
  float sum = 0.f, mine = 0.f;  // lane j keeps pick j's weight
  for (int j = 0; j < top_k; j++) {
    int best_i = -1;
    float best = 0.f;
#pragma unroll
    for (int i = 0; i < ROUTE_MAX_PER_LANE; i++) {
      if (!(taken & (1u << i)) && (best_i < 0 || c[i] > best)) {
        best = c[i];
        best_i = i;
      }
    }
    int e = best_i < 0 ? 0x7fffffff : lane + 32 * best_i;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      float ob = __shfl_xor_sync(0xffffffffu, best, o);
      int oe = __shfl_xor_sync(0xffffffffu, e, o);
      if (oe != 0x7fffffff && (e == 0x7fffffff || ob > best || (ob == best && oe < e))) {
        best = ob;
        e = oe;
      }
    }
    if ((e & 31) == lane) taken |= 1u << (e >> 5);
    float s = 1.f / (1.f + expf(-to_f32(row[e])));
    sum += s;
    if (lane == j) {
      mine = s;
      ids[(long long)t * top_k + j] = e;
    }
  }
  if (lane < top_k) weights[(long long)t * top_k + lane] = renorm ? mine / sum : mine;
}

#define MOE_ROUTE_BIASED(T, S)                                                                \
  extern "C" __global__ void __launch_bounds__(ROUTE_WARPS * 32)                             \
      moe_route_biased_##S(float* w, int* ids, const T* logits, const float* bias, int ntok,  \
                           int E, int k, int renorm) {                                         \
    moe_route_biased_impl<T>(w, ids, logits, bias, ntok, E, k, renorm);                        \
  }
INSTANTIATE(MOE_ROUTE_BIASED)
