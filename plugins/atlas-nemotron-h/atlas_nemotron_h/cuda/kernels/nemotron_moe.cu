// atlas-nemotron-h: MoE routing and non-gated experts (references in
// atlas_nemotron_h/ffn_reference.py). Math in float32.
#include "common.cuh"

#define NM_MAX_EXPERTS 1024
#define NM_MAX_GROUPS 64
#define NM_WARPS 4

__device__ __forceinline__ float nm_warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// A warp's dot product of x[0:n] and w[0:n] (float32 sum, every lane holds it): 16-byte
// vector loads when n is a multiple of 8 (rows then start 16-byte aligned), else scalar.
template <typename X, typename W>
__device__ __forceinline__ float nm_dot(const X* x, const W* w, int n, int lane) {
  float acc = 0.f;
  if ((n & 7) == 0) {
    for (int c = lane * 8; c < n; c += 256) {
      Vec8<X> xv;
      Vec8<W> wv;
      xv.load(x + c);
      wv.load(w + c);
      float xf[8], wf[8];
      xv.to_float(xf);
      wv.to_float(wf);
#pragma unroll
      for (int i = 0; i < 8; i++) acc += xf[i] * wf[i];
    }
  } else {
    for (int c = lane; c < n; c += 32) acc += to_f32(x[c]) * to_f32(w[c]);
  }
  return nm_warp_sum(acc);
}

// Grid (num_tokens), block 32 * NM_WARPS. Logits x . w_e in float32 (a warp per expert), then
// one thread picks: group scores (sum of the two best biased scores), the topk_group best
// groups, the top_k best biased scores among them (ties: lower index), weighted by the
// unbiased sigmoid, renormalised (sum + 1e-20) and scaled.
template <typename T>
__device__ void nm_route_impl(float* weights, int* ids, const T* x, const float* w,
                              const float* bias, int hidden, int E, int top_k, int n_group,
                              int topk_group, int renorm, float scale) {
  __shared__ float score[NM_MAX_EXPERTS], choice[NM_MAX_EXPERTS];
  __shared__ unsigned char keep[NM_MAX_GROUPS];
  int t = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const T* xr = x + (long long)t * hidden;
  for (int e = warp; e < E; e += NM_WARPS) {
    float acc = nm_dot(xr, w + (long long)e * hidden, hidden, lane);
    if (lane == 0) {
      float s = 1.f / (1.f + expf(-acc));
      score[e] = s;
      choice[e] = s + bias[e];
    }
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  int per = E / n_group;
  for (int g = 0; g < n_group; g++) keep[g] = n_group == 1;
  for (int j = 0; j < topk_group && n_group > 1; j++) {
    int best = -1;
    float best_v = 0.f;
    for (int g = 0; g < n_group; g++) {
      if (keep[g]) continue;
      float a = NEG_INF, b = NEG_INF;
      for (int e = g * per; e < (g + 1) * per; e++) {
        float c = choice[e];
        if (c > a) { b = a; a = c; } else if (c > b) { b = c; }
      }
      if (best < 0 || a + b > best_v) { best = g; best_v = a + b; }
    }
    keep[best] = 1;
  }
  float sum = 0.f;
  float* wt = weights + (long long)t * top_k;
  int* id = ids + (long long)t * top_k;
  for (int j = 0; j < top_k; j++) {
    int best = -1;
    float best_c = 0.f;
    for (int e = 0; e < E; e++) {
      if (!keep[e / per]) continue;
      bool taken = false;
      for (int q = 0; q < j; q++) taken |= id[q] == e;
      if (!taken && (best < 0 || choice[e] > best_c)) { best = e; best_c = choice[e]; }
    }
    id[j] = best;
    wt[j] = score[best];
    sum += score[best];
  }
  for (int j = 0; j < top_k; j++) wt[j] = (renorm ? wt[j] / (sum + 1e-20f) : wt[j]) * scale;
}

// Grid (ceil(I / NM_WARPS), num_tokens * top_k): h[r, i] = relu2(up_e[i] . x[t]) in float32,
// r = t * top_k + j, e = ids[r]; a warp per row i.
template <typename T>
__device__ void nm_up_impl(float* h, const T* x, const T* w_up, const int* ids, int width,
                           int inter, int top_k) {
  int i = blockIdx.x * NM_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  long long r = blockIdx.y;
  if (i >= inter) return;
  const T* wr = w_up + ((long long)ids[r] * inter + i) * width;
  float acc = fmaxf(nm_dot(x + (r / top_k) * width, wr, width, lane), 0.f);
  if (lane == 0) h[r * inter + i] = acc * acc;
}

// Grid (ceil(width / NM_WARPS), num_tokens): out[t, o] = sum_j weights[t, j] *
// (down_{ids[t, j]}[o] . h[t * top_k + j]); a warp per output feature.
template <typename T>
__device__ void nm_down_impl(T* out, const float* h, const T* w_down, const float* weights,
                             const int* ids, int width, int inter, int top_k) {
  int o = blockIdx.x * NM_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  long long t = blockIdx.y;
  if (o >= width) return;
  float total = 0.f;
  for (int j = 0; j < top_k; j++) {
    long long r = t * top_k + j;
    const T* wr = w_down + ((long long)ids[r] * width + o) * inter;
    total += nm_dot(h + r * inter, wr, inter, lane) * weights[r];
  }
  if (lane == 0) out[t * width + o] = from_f32<T>(total);
}

// Grid (ceil(width / 256), num_tokens): out[t, o] = sum_j weights[t, j] * rows[pos[t, j], o],
// rows holding every (token, expert) pair's expert output (the grouped prefill path).
template <typename T>
__device__ void nm_combine_impl(T* out, const T* rows, const float* weights, const int* pos,
                                int width, int top_k) {
  int o = blockIdx.x * blockDim.x + threadIdx.x;
  long long t = blockIdx.y;
  if (o >= width) return;
  float total = 0.f;
  for (int j = 0; j < top_k; j++)
    total += weights[t * top_k + j] * to_f32(rows[(long long)pos[t * top_k + j] * width + o]);
  out[t * width + o] = from_f32<T>(total);
}

#define NEMOTRON_MOE(T, S)                                                                    \
  extern "C" __global__ void nemotron_h_moe_route_##S(                                        \
      float* wt, int* ids, const T* x, const float* w, const float* bias, int hidden, int E,  \
      int k, int n_group, int topk_group, int renorm, float scale) {                          \
    nm_route_impl<T>(wt, ids, x, w, bias, hidden, E, k, n_group, topk_group, renorm, scale);  \
  }                                                                                           \
  extern "C" __global__ void nemotron_h_moe_up_##S(float* h, const T* x, const T* w_up,       \
                                                   const int* ids, int width, int inter,      \
                                                   int k) {                                   \
    nm_up_impl<T>(h, x, w_up, ids, width, inter, k);                                          \
  }                                                                                           \
  extern "C" __global__ void nemotron_h_moe_down_##S(T* out, const float* h, const T* w_down, \
                                                     const float* wt, const int* ids,         \
                                                     int width, int inter, int k) {           \
    nm_down_impl<T>(out, h, w_down, wt, ids, width, inter, k);                                \
  }                                                                                           \
  extern "C" __global__ void nemotron_h_moe_combine_##S(T* out, const T* rows, const float* wt, \
                                                        const int* pos, int width, int k) {   \
    nm_combine_impl<T>(out, rows, wt, pos, width, k);                                         \
  }
INSTANTIATE(NEMOTRON_MOE)
