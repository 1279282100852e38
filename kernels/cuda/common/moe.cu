// Mixture of experts: top-k routing and grouped expert compute for decode-sized batches.
// moe_gate_up: warp per (token-slot, intermediate row) computes act(gate) * up in float32;
// moe_down: warp per (token, hidden row) sums the token's experts weighted by the router.
#include "common.cuh"

// One block per token; num_experts <= 4 * blockDim.x.
template <typename T>
__device__ void moe_route_impl(float* weights, int* ids, const T* logits, int E, int top_k,
                               int renormalize, int sigmoid) {
  __shared__ float scores[1024];
  __shared__ float sv[32];
  __shared__ int si[32];
  __shared__ float cw[64];
  __shared__ int ci[64];
  const T* row = logits + (long long)blockIdx.x * E;
  float mx = NEG_INF;
  for (int e = threadIdx.x; e < E; e += blockDim.x) { scores[e] = to_f32(row[e]); mx = fmaxf(mx, scores[e]); }
  mx = block_max(mx, sv);
  float sum = 0.f;
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    float s = sigmoid ? 1.f / (1.f + __expf(-scores[e])) : __expf(scores[e] - mx);
    scores[e] = s; sum += s;
  }
  sum = sigmoid ? 1.f : block_sum(sum, sv);
  float prev_v = __int_as_float(0x7f800000); int prev_i = -1;
  float chosen = 0.f;
  for (int j = 0; j < top_k; j++) {
    float v = NEG_INF; int idx = 0x7fffffff;
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
      float s = scores[e];
      bool after = s < prev_v || (s == prev_v && e > prev_i);
      if (after) argmax_pair(v, idx, s, e);
    }
    block_argmax(v, idx, sv, si);
    if (threadIdx.x == 0) { cw[j] = v / sum; ci[j] = idx; }
    chosen += v / sum;
    prev_v = v; prev_i = idx;
  }
  __syncthreads();
  if (threadIdx.x < top_k) {
    weights[blockIdx.x * top_k + threadIdx.x] = renormalize ? cw[threadIdx.x] / chosen : cw[threadIdx.x];
    ids[blockIdx.x * top_k + threadIdx.x] = ci[threadIdx.x];
  }
}

__device__ __forceinline__ float act_fn(float x, int gelu) {
  return gelu ? 0.5f * x * (1.f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)))
              : x / (1.f + __expf(-x));
}

// h[p, n] = act(x[t] . Wgu[e, n]) * (x[t] . Wgu[e, I + n]) for pair p = (t, j), e = ids[p].
template <typename T>
__device__ void moe_gate_up_impl(float* h, const T* x, const T* w, const int* ids, int top_k,
                                 int hidden, int inter, int gelu) {
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int n = blockIdx.x * (blockDim.x >> 5) + warp, p = blockIdx.y;
  if (n >= inter) return;
  int e = ids[p];
  const T* xr = x + (long long)(p / top_k) * hidden;
  const T* wg = w + ((long long)e * 2 * inter + n) * hidden;
  const T* wu = wg + (long long)inter * hidden;
  float g = 0.f, u = 0.f;
  for (int k = lane * 8; k < hidden; k += 256) {
    float xf[8], gf[8], uf[8];
    Vec8<T> xv, gv, uv; gv.load(wg + k); uv.load(wu + k); xv.load(xr + k);
    xv.to_float(xf); gv.to_float(gf); uv.to_float(uf);
#pragma unroll
    for (int i = 0; i < 8; i++) { g += xf[i] * gf[i]; u += xf[i] * uf[i]; }
  }
  g = warp_sum(g); u = warp_sum(u);
  if (lane == 0) h[(long long)p * inter + n] = act_fn(g, gelu) * u;
}

// out[t, n] = sum_j weights[t, j] * (h[(t, j)] . Wd[ids[t, j], n]).
template <typename T>
__device__ void moe_down_impl(T* out, const float* h, const T* w, const float* weights,
                              const int* ids, int top_k, int hidden, int inter) {
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int n = blockIdx.x * (blockDim.x >> 5) + warp, t = blockIdx.y;
  if (n >= hidden) return;
  float total = 0.f;
  for (int j = 0; j < top_k; j++) {
    int p = t * top_k + j;
    const T* wr = w + ((long long)ids[p] * hidden + n) * inter;
    const float* hr = h + (long long)p * inter;
    float s = 0.f;
    for (int k = lane * 8; k < inter; k += 256) {
      float wf[8], hf[8];
      Vec8<T> wv; wv.load(wr + k); wv.to_float(wf);
      Vec8<float> hv; hv.load(hr + k); hv.to_float(hf);
#pragma unroll
      for (int i = 0; i < 8; i++) s += wf[i] * hf[i];
    }
    total += warp_sum(s) * weights[p];
  }
  if (lane == 0) out[(long long)t * hidden + n] = from_f32<T>(total);
}

#define MOE(T, S)                                                                             \
  extern "C" __global__ void moe_route_##S(float* wts, int* ids, const T* logits, int E,     \
                                           int k, int renorm, int sig) {                      \
    moe_route_impl<T>(wts, ids, logits, E, k, renorm, sig);                                   \
  }                                                                                           \
  extern "C" __global__ void moe_gate_up_##S(float* h, const T* x, const T* w, const int* ids,\
                                             int k, int hidden, int inter, int gelu) {        \
    moe_gate_up_impl<T>(h, x, w, ids, k, hidden, inter, gelu);                                \
  }                                                                                           \
  extern "C" __global__ void moe_down_##S(T* out, const float* h, const T* w,                 \
                                          const float* wts, const int* ids, int k, int hidden,\
                                          int inter) {                                        \
    moe_down_impl<T>(out, h, w, wts, ids, k, hidden, inter);                                  \
  }
INSTANTIATE(MOE)
