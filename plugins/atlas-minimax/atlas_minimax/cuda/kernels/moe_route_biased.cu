// atlas-minimax: moe_route_biased (reference atlas_minimax.routing.moe_route_biased). Per
// token: s = sigmoid(logit) in float32; the top_k experts by s + bias (ties: lower expert
// first), weighted by s, divided by their sum when renorm. A thread per token, experts scanned
// in order once per pick (E <= 1024, top_k <= 32): routing is a sliver of an MoE layer's work.
#include "common.cuh"

template <typename T>
__device__ void moe_route_biased_impl(float* weights, int* ids, const T* logits,
                                      const float* bias, int ntok, int E, int top_k, int renorm) {
  int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= ntok) return;
  const T* row = logits + (long long)t * E;
  float* w = weights + (long long)t * top_k;
  int* id = ids + (long long)t * top_k;
  unsigned taken[32];
  for (int i = 0; i < 32; i++) taken[i] = 0u;
  float sum = 0.f;
  for (int j = 0; j < top_k; j++) {
    int best = -1;
    float best_choice = 0.f, best_score = 0.f;
    for (int e = 0; e < E; e++) {
      if (taken[e >> 5] & (1u << (e & 31))) continue;
      float s = 1.f / (1.f + expf(-to_f32(row[e])));
      float c = s + bias[e];
      if (best < 0 || c > best_choice) {
        best = e;
        best_choice = c;
        best_score = s;
      }
    }
    taken[best >> 5] |= 1u << (best & 31);
    id[j] = best;
    w[j] = best_score;
    sum += best_score;
  }
  if (renorm) {
    for (int j = 0; j < top_k; j++) w[j] /= sum;
  }
}

#define MOE_ROUTE_BIASED(T, S)                                                                \
  extern "C" __global__ void moe_route_biased_##S(float* w, int* ids, const T* logits,        \
                                                  const float* bias, int ntok, int E, int k,   \
                                                  int renorm) {                                \
    moe_route_biased_impl<T>(w, ids, logits, bias, ntok, E, k, renorm);                        \
  }
INSTANTIATE(MOE_ROUTE_BIASED)
