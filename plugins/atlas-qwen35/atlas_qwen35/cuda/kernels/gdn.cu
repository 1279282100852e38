// Gated DeltaNet helpers: depthwise causal conv1d (prefill and one-token update) with float32
// conv state, decay/beta gating and gated RMSNorm. Math in float32.
// State slots follow atlas_qwen35/gdn_reference.py: state_indices[b] < 0 is a padding row (state
// neither read nor written); a sequence whose seq_lens equals its query count starts from zeros.
#include "common.cuh"

#define CONV_KMAX 8
#define CONV_CHANNELS 64

__device__ __forceinline__ float silu_f(float x) { return x / (1.f + expf(-x)); }
__device__ __forceinline__ float sigmoid_f(float x) { return 1.f / (1.f + expf(-x)); }

// Grid (ceil(dim / 64), num_seqs), block 64 * token lanes. Thread: one channel, every
// (blockDim / 64)-th token of its sequence. xs = [state (K - 1 rows); x of the sequence].
template <typename T>
__device__ void causal_conv1d_impl(T* out, const T* x, const T* w, const T* bias, float* states,
                                   const int* cu, const int* seq_lens, const int* state_indices,
                                   int dim, int k, int silu) {
  int b = blockIdx.y, ch = blockIdx.x * CONV_CHANNELS + threadIdx.x % CONV_CHANNELS;
  int lane_t = threadIdx.x / CONV_CHANNELS, num_lanes = blockDim.x / CONV_CHANNELS;
  int start = cu[b], n = cu[b + 1] - start, slot = state_indices[b];
  bool has_state = slot >= 0 && seq_lens[b] > n, active = ch < dim;
  float* st = states + (long long)(slot < 0 ? 0 : slot) * (k - 1) * dim + ch;
  float wf[CONV_KMAX];
#pragma unroll
  for (int i = 0; i < CONV_KMAX; i++)
    wf[i] = active && i < k ? to_f32(w[(long long)ch * k + i]) : 0.f;
  float bf = active && bias ? to_f32(bias[ch]) : 0.f;
  for (int t = lane_t; active && t < n; t += num_lanes) {
    float acc = 0.f;
#pragma unroll
    for (int i = 0; i < CONV_KMAX; i++) {
      int p = t + i - (k - 1);
      if (i < k) {
        float xv = p >= 0 ? to_f32(x[(long long)(start + p) * dim + ch])
                          : (has_state ? st[(long long)(k - 1 + p) * dim] : 0.f);
        acc += wf[i] * xv;
      }
    }
    acc += bf;
    out[(long long)(start + t) * dim + ch] = from_f32<T>(silu ? silu_f(acc) : acc);
  }
  __syncthreads();  // every read of the old state is done before it is overwritten
  if (lane_t != 0 || !active || slot < 0) return;
  float nv[CONV_KMAX];
#pragma unroll
  for (int r = 0; r < CONV_KMAX - 1; r++) {
    int p = n + r;  // row of xs
    if (r < k - 1)
      nv[r] = p < k - 1 ? (has_state ? st[(long long)p * dim] : 0.f)
                        : to_f32(x[(long long)(start + p - (k - 1)) * dim + ch]);
  }
#pragma unroll
  for (int r = 0; r < CONV_KMAX - 1; r++)
    if (r < k - 1) st[(long long)r * dim] = nv[r];
}

// Grid (ceil(dim / blockDim), num_seqs): one new token per sequence, one thread per channel.
// Launched with PDL (gdn_conv_gating), only x waits: the slots and lengths are host-written, the
// conv state was last written by this layer's kernel of an earlier step (an earlier launch),
// the weights are static; griddepcontrol.wait is a no-op in a plain launch.
template <typename T>
__device__ void causal_conv1d_update_impl(T* out, const T* x, const T* w, const T* bias,
                                          float* states, const int* seq_lens,
                                          const int* state_indices, int dim, int k, int silu) {
  int b = blockIdx.y, ch = blockIdx.x * blockDim.x + threadIdx.x;
  if (ch >= dim) return;
  int slot = state_indices[b];
  bool has_state = slot >= 0 && seq_lens[b] > 1;
  float* st = states + (long long)(slot < 0 ? 0 : slot) * (k - 1) * dim + ch;
  float xs[CONV_KMAX], wf[CONV_KMAX];
#pragma unroll
  for (int i = 0; i < CONV_KMAX; i++) {
    if (i < k - 1) xs[i] = has_state ? st[(long long)i * dim] : 0.f;
    if (i < k) wf[i] = to_f32(w[(long long)ch * k + i]);
  }
  pdl_wait();
  float xn = to_f32(x[(long long)b * dim + ch]);
#pragma unroll
  for (int i = 0; i < CONV_KMAX; i++)
    if (i == k - 1) xs[i] = xn;
  float acc = 0.f;
#pragma unroll
  for (int i = 0; i < CONV_KMAX; i++)
    if (i < k) acc += wf[i] * xs[i];
  if (bias) acc += to_f32(bias[ch]);
  out[(long long)b * dim + ch] = from_f32<T>(silu ? silu_f(acc) : acc);
  if (slot < 0) return;
#pragma unroll
  for (int i = 0; i < CONV_KMAX - 1; i++)
    if (i < k - 1) st[(long long)i * dim] = xs[i + 1];
}

// Decode step of a GDN layer, first half (gated_delta_rule_decode): causal_conv1d_update of
// qkv (silu, no bias) in blocks 0 .. gridDim.x - 2, gdn_gating of ba in the last block.
// Grid (ceil(dim / blockDim) + 1, num_seqs); A_log and dt_bias float32. PDL-launched.
template <typename T>
__device__ void gdn_conv_gating_impl(T* out, float* g, float* beta, const T* x, const T* w,
                                     float* states, const int* seq_lens, const int* state_indices,
                                     int dim, int k, const T* ba, const float* a_log,
                                     const float* dt_bias, int nv) {
  pdl_trigger();
  if (blockIdx.x + 1 < gridDim.x) {  // waits inside, after its loads of the state
    causal_conv1d_update_impl<T>(out, x, w, (const T*)nullptr, states, seq_lens, state_indices,
                                 dim, k, 1);
    return;
  }
  pdl_wait();
  long long b = blockIdx.y;
  for (int h = threadIdx.x; h < nv; h += blockDim.x) {
    float bv = to_f32(ba[b * 2 * nv + h]);
    float av = to_f32(ba[b * 2 * nv + nv + h]) + dt_bias[h];
    float sp = av > 20.f ? av : log1pf(expf(fminf(av, 20.f)));
    beta[b * nv + h] = sigmoid_f(bv);
    g[b * nv + h] = -expf(a_log[h]) * sp;
  }
}

// beta = sigmoid(b), g = -exp(A_log) * softplus(a + dt_bias); ba rows are [b (H), a (H)].
template <typename T>
__device__ void gdn_gating_impl(float* g, float* beta, const T* ba, const float* a_log,
                                const float* dt_bias, int num_heads, long long n) {
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x) {
    long long t = i / num_heads;
    int h = (int)(i - t * num_heads);
    float bv = to_f32(ba[t * 2 * num_heads + h]);
    float av = to_f32(ba[t * 2 * num_heads + num_heads + h]) + dt_bias[h];
    float sp = av > 20.f ? av : log1pf(expf(fminf(av, 20.f)));
    beta[i] = sigmoid_f(bv);
    g[i] = -expf(a_log[h]) * sp;
  }
}

// One warp per row of d: y = x * rsqrt(mean(x^2) + eps) * w * silu(gate).
template <typename T, typename W>
__device__ void rms_norm_gated_impl(T* y, const T* x, const T* gate, const W* w, float eps,
                                    int d, long long rows) {
  long long row = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  int lane = threadIdx.x & 31;
  if (row >= rows) return;
  const T* xr = x + row * d;
  float ss = 0.f;
  for (int i = lane; i < d; i += 32) { float v = to_f32(xr[i]); ss += v * v; }
  float inv = rsqrtf(warp_sum(ss) / d + eps);
  for (int i = lane; i < d; i += 32) {
    float gv = silu_f(to_f32(gate[row * d + i]));
    y[row * d + i] = from_f32<T>(to_f32(xr[i]) * inv * to_f32(w[i]) * gv);
  }
}

#define GDN(T, S)                                                                              \
  extern "C" __global__ void causal_conv1d_##S(T* out, const T* x, const T* w, const T* bias,  \
      float* states, const int* cu, const int* seq_lens, const int* idx, int dim, int k,       \
      int silu) {                                                                              \
    causal_conv1d_impl<T>(out, x, w, bias, states, cu, seq_lens, idx, dim, k, silu);           \
  }                                                                                            \
  extern "C" __global__ void causal_conv1d_update_##S(T* out, const T* x, const T* w,          \
      const T* bias, float* states, const int* seq_lens, const int* idx, int dim, int k,       \
      int silu) {                                                                              \
    causal_conv1d_update_impl<T>(out, x, w, bias, states, seq_lens, idx, dim, k, silu);        \
  }                                                                                            \
  extern "C" __global__ void gdn_conv_gating_##S(T* out, float* g, float* beta, const T* x,    \
      const T* w, float* states, const int* seq_lens, const int* idx, int dim, int k,          \
      const T* ba, const float* a_log, const float* dt_bias, int nv) {                         \
    gdn_conv_gating_impl<T>(out, g, beta, x, w, states, seq_lens, idx, dim, k, ba, a_log,      \
                            dt_bias, nv);                                                      \
  }                                                                                            \
  extern "C" __global__ void gdn_gating_##S(float* g, float* beta, const T* ba,                \
      const float* a_log, const float* dt_bias, int h, long long n) {                          \
    gdn_gating_impl<T>(g, beta, ba, a_log, dt_bias, h, n);                                     \
  }                                                                                            \
  extern "C" __global__ void rms_norm_gated_##S(T* y, const T* x, const T* gate, const T* w,   \
      float eps, int d, long long rows) {                                                      \
    rms_norm_gated_impl<T, T>(y, x, gate, w, eps, d, rows);                                    \
  }                                                                                            \
  extern "C" __global__ void rms_norm_gated_wf32_##S(T* y, const T* x, const T* gate,          \
      const float* w, float eps, int d, long long rows) {                                      \
    rms_norm_gated_impl<T, float>(y, x, gate, w, eps, d, rows);                                \
  }
INSTANTIATE(GDN)
