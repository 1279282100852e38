// atlas-deepseek: moe_route_grouped (reference atlas_deepseek.routing.moe_route_grouped). A
// thread per token: scores (sigmoid, or softmax over the experts), choice = score + bias, the
// topk_groups groups with the best two-expert sums, then the top_k experts inside them (ties:
// lower index), weighted by score, renormalised (sum + 1e-20) and scaled. E <= 1024,
// groups <= 32, top_k <= 32: routing is a sliver of an MoE layer's work.
#include "common.cuh"

template <typename T>
__device__ __forceinline__ float route_score(const T* row, int e, int softmax, float mx,
                                             float inv_sum) {
  float x = to_f32(row[e]);
  return softmax ? __expf(x - mx) * inv_sum : 1.f / (1.f + __expf(-x));
}

template <typename T>
__device__ void moe_route_grouped_impl(float* weights, int* ids, const T* logits,
                                       const float* bias, int ntok, int E, int top_k,
                                       int groups, int topk_groups, int softmax, int renorm,
                                       float factor) {
  int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= ntok) return;
  const T* row = logits + (long long)t * E;
  float mx = NEG_INF, inv_sum = 1.f;
  if (softmax) {
    for (int e = 0; e < E; e++) mx = fmaxf(mx, to_f32(row[e]));
    float sum = 0.f;
    for (int e = 0; e < E; e++) sum += __expf(to_f32(row[e]) - mx);
    inv_sum = 1.f / sum;
  }
  int per = E / groups;
  unsigned allowed = groups > 1 ? 0u : 1u;
  if (groups > 1) {
    float gscore[32];
    for (int g = 0; g < groups; g++) {
      float a = NEG_INF, b = NEG_INF;
      for (int e = g * per; e < (g + 1) * per; e++) {
        float c = route_score(row, e, softmax, mx, inv_sum) + (bias ? bias[e] : 0.f);
        if (c > a) { b = a; a = c; } else if (c > b) { b = c; }
      }
      gscore[g] = a + b;
    }
    for (int k = 0; k < topk_groups; k++) {
      int best = -1;
      for (int g = 0; g < groups; g++)
        if (!(allowed & (1u << g)) && (best < 0 || gscore[g] > gscore[best])) best = g;
      allowed |= 1u << best;
    }
  }
  unsigned taken[32];
  for (int i = 0; i < 32; i++) taken[i] = 0u;
  float* w = weights + (long long)t * top_k;
  int* id = ids + (long long)t * top_k;
  float sum = 0.f;
  for (int j = 0; j < top_k; j++) {
    int best = -1;
    float best_choice = 0.f, best_score = 0.f;
    for (int e = 0; e < E; e++) {
      if (groups > 1 && !(allowed & (1u << (e / per)))) continue;
      if (taken[e >> 5] & (1u << (e & 31))) continue;
      float s = route_score(row, e, softmax, mx, inv_sum);
      float c = s + (bias ? bias[e] : 0.f);
      if (best < 0 || c > best_choice) { best = e; best_choice = c; best_score = s; }
    }
    taken[best >> 5] |= 1u << (best & 31);
    id[j] = best;
    w[j] = best_score;
    sum += best_score;
  }
  float norm = renorm ? 1.f / (sum + 1e-20f) : 1.f;
  for (int j = 0; j < top_k; j++) w[j] = w[j] * norm * factor;
}

#define MOE_ROUTE_GROUPED(T, S)                                                                \
  extern "C" __global__ void moe_route_grouped_##S(                                            \
      float* w, int* ids, const T* logits, const float* bias, int ntok, int E, int k,          \
      int groups, int topk_groups, int softmax, int renorm, float factor) {                    \
    moe_route_grouped_impl<T>(w, ids, logits, bias, ntok, E, k, groups, topk_groups, softmax,  \
                              renorm, factor);                                                 \
  }
INSTANTIATE(MOE_ROUTE_GROUPED)
