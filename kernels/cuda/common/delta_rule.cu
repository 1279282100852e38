// Gated delta rule over packed variable-length sequences, token by token, float32 state.
// Per value head h (key head h / (Hv / Hk)), with q, k optionally L2-normalised and q scaled:
//   S = exp(g_t) S;  S += k_t (beta_t (v_t - S^T k_t))^T;  o_t = S^T q_t
// Columns of S ([Dk, Dv]) evolve independently, so a block owns a slab of columns of one
// (sequence, head): `lanes` threads share a column (rows r, r + lanes, ...; at most
// DR_ROWS each, kept in registers) and reduce over it with shuffles. Grid
// (ceil(Dv / (blockDim / lanes)), Hv, num_seqs); dynamic shared memory 4 * Dk floats (q and k
// of the current and the next token). Serves decode and, as a first version, prefill.
#include "common.cuh"

#define DR_ROWS 32

__device__ __forceinline__ float group_sum(float v, int lanes) {
  for (int o = lanes >> 1; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum of squares of a[0..n) computed by every warp on its own (no block barrier).
__device__ __forceinline__ float warp_sumsq(const float* a, int n) {
  float s = 0.f;
  for (int i = threadIdx.x & 31; i < n; i += 32) s += a[i] * a[i];
  return warp_sum(s);
}

template <typename T>
__device__ __forceinline__ void load_qk(float* buf, const T* row, int q_off, int k_off, int dk) {
  for (int i = threadIdx.x; i < dk; i += blockDim.x) {
    buf[i] = to_f32(row[q_off + i]);
    buf[dk + i] = to_f32(row[k_off + i]);
  }
}

template <typename T>
__device__ void gated_delta_rule_impl(T* out, const T* qkv, const float* g, const float* beta,
                                      float* states, const int* cu, const int* seq_lens,
                                      const int* state_indices, int num_k_heads, int num_v_heads,
                                      int dk, int dv, float scale, int l2norm, int lanes) {
  extern __shared__ float smem[];  // [2][q (dk), k (dk)]
  int b = blockIdx.z, h = blockIdx.y;
  int start = cu[b], end = cu[b + 1];
  if (end <= start) return;
  int slot = state_indices[b];
  bool has_state = slot >= 0 && seq_lens[b] > end - start;
  int r = threadIdx.x % lanes, j = blockIdx.x * (blockDim.x / lanes) + threadIdx.x / lanes;
  bool active = j < dv;
  int kh = h / (num_v_heads / num_k_heads);
  long long stride = 2LL * num_k_heads * dk + (long long)num_v_heads * dv;
  int q_off = kh * dk, k_off = num_k_heads * dk + kh * dk;
  int v_off = 2 * num_k_heads * dk + h * dv + (active ? j : 0);
  float* sp = states + ((long long)(slot < 0 ? 0 : slot) * num_v_heads + h) * dk * dv + j;
  float s[DR_ROWS];
#pragma unroll
  for (int m = 0; m < DR_ROWS; m++) {
    int i = r + lanes * m;
    s[m] = has_state && active && i < dk ? sp[(long long)i * dv] : 0.f;
  }
  load_qk(smem, qkv + start * stride, q_off, k_off, dk);
  float v_next = to_f32(qkv[start * stride + v_off]);
  float g_next = g[(long long)start * num_v_heads + h];
  float b_next = beta[(long long)start * num_v_heads + h];
  __syncthreads();
  for (int t = start; t < end; t++) {
    const float* qs = smem + ((t - start) & 1) * 2 * dk;
    const float* ks = qs + dk;
    float vj = v_next, decay = expf(g_next), bt = b_next;
    if (t + 1 < end) {
      const T* next = qkv + (long long)(t + 1) * stride;
      load_qk(smem + ((t + 1 - start) & 1) * 2 * dk, next, q_off, k_off, dk);
      v_next = to_f32(next[v_off]);
      g_next = g[(long long)(t + 1) * num_v_heads + h];
      b_next = beta[(long long)(t + 1) * num_v_heads + h];
    }
    float qscale = scale, kscale = 1.f;
    if (l2norm) {
      qscale *= rsqrtf(warp_sumsq(qs, dk) + 1e-6f);
      kscale = rsqrtf(warp_sumsq(ks, dk) + 1e-6f);
    }
    float kv = 0.f;
#pragma unroll
    for (int m = 0; m < DR_ROWS; m++) {
      int i = r + lanes * m;
      if (i < dk) { s[m] *= decay; kv += s[m] * ks[i]; }
    }
    float delta = (vj - group_sum(kv, lanes) * kscale) * bt * kscale;
    float o = 0.f;
#pragma unroll
    for (int m = 0; m < DR_ROWS; m++) {
      int i = r + lanes * m;
      if (i < dk) { s[m] += ks[i] * delta; o += s[m] * qs[i]; }
    }
    o = group_sum(o, lanes) * qscale;
    if (active && r == 0) out[((long long)t * num_v_heads + h) * dv + j] = from_f32<T>(o);
    __syncthreads();  // the buffer read this token is refilled next token
  }
  if (slot < 0 || !active) return;
#pragma unroll
  for (int m = 0; m < DR_ROWS; m++) {
    int i = r + lanes * m;
    if (i < dk) sp[(long long)i * dv] = s[m];
  }
}

// Decode step, second half (gated_delta_rule_decode): one token per sequence, a block per
// (value head, sequence) of Dv * lanes threads, so the gated RMSNorm over the head's Dv outputs
// (rounded to T first, as the separate ops round them) stays in the block. qkv is the conv
// output; dynamic shared memory (2 * Dk + 32) floats. PDL-launched.
template <typename T>
__device__ void gdn_decode_norm_impl(T* out, const T* qkv, const T* z, const float* g,
                                     const float* beta, float* states, const int* seq_lens,
                                     const int* state_indices, const T* norm_w, int num_k_heads,
                                     int num_v_heads, int dk, int dv, float scale, int lanes,
                                     float eps) {
  extern __shared__ float smem[];  // q (dk), k (dk), block_sum scratch (32)
  int b = blockIdx.y, h = blockIdx.x;
  int r = threadIdx.x % lanes, j = threadIdx.x / lanes;
  pdl_trigger();
  pdl_wait();
  int slot = state_indices[b];
  bool has_state = slot >= 0 && seq_lens[b] > 1;
  int kh = h / (num_v_heads / num_k_heads);
  const T* row = qkv + (long long)b * (2LL * num_k_heads * dk + (long long)num_v_heads * dv);
  load_qk(smem, row, kh * dk, num_k_heads * dk + kh * dk, dk);
  float* sp = states + ((long long)(slot < 0 ? 0 : slot) * num_v_heads + h) * dk * dv + j;
  float s[DR_ROWS];
#pragma unroll
  for (int m = 0; m < DR_ROWS; m++) {
    int i = r + lanes * m;
    s[m] = has_state && i < dk ? sp[(long long)i * dv] : 0.f;
  }
  float vj = to_f32(row[2 * num_k_heads * dk + h * dv + j]);
  float decay = expf(g[(long long)b * num_v_heads + h]), bt = beta[(long long)b * num_v_heads + h];
  __syncthreads();
  const float* qs = smem;
  const float* ks = smem + dk;
  float qscale = scale * rsqrtf(warp_sumsq(qs, dk) + 1e-6f);
  float kscale = rsqrtf(warp_sumsq(ks, dk) + 1e-6f);
  float kv = 0.f;
#pragma unroll
  for (int m = 0; m < DR_ROWS; m++) {
    int i = r + lanes * m;
    if (i < dk) { s[m] *= decay; kv += s[m] * ks[i]; }
  }
  float delta = (vj - group_sum(kv, lanes) * kscale) * bt * kscale;
  float o = 0.f;
#pragma unroll
  for (int m = 0; m < DR_ROWS; m++) {
    int i = r + lanes * m;
    if (i < dk) { s[m] += ks[i] * delta; o += s[m] * qs[i]; }
  }
  o = to_f32(from_f32<T>(group_sum(o, lanes) * qscale));
  if (slot >= 0) {
#pragma unroll
    for (int m = 0; m < DR_ROWS; m++) {
      int i = r + lanes * m;
      if (i < dk) sp[(long long)i * dv] = s[m];
    }
  }
  float inv = rsqrtf(block_sum(r == 0 ? o * o : 0.f, smem + 2 * dk) / dv + eps);
  if (r == 0) {
    long long oi = ((long long)b * num_v_heads + h) * dv + j;
    float zv = to_f32(z[oi]);
    out[oi] = from_f32<T>(o * inv * to_f32(norm_w[j]) * (zv / (1.f + expf(-zv))));
  }
}

#define DELTA_RULE(T, S)                                                                       \
  extern "C" __global__ void __launch_bounds__(128) gated_delta_rule_##S(                      \
      T* out, const T* qkv, const float* g, const float* beta, float* states, const int* cu,  \
      const int* seq_lens, const int* idx, int hk, int hv, int dk, int dv, float scale,        \
      int l2norm, int lanes) {                                                                 \
    gated_delta_rule_impl<T>(out, qkv, g, beta, states, cu, seq_lens, idx, hk, hv, dk, dv,     \
                             scale, l2norm, lanes);                                            \
  }                                                                                            \
  extern "C" __global__ void __launch_bounds__(512) gdn_decode_norm_##S(                       \
      T* out, const T* qkv, const T* z, const float* g, const float* beta, float* states,      \
      const int* seq_lens, const int* idx, const T* norm_w, int hk, int hv, int dk, int dv,    \
      float scale, int lanes, float eps) {                                                     \
    gdn_decode_norm_impl<T>(out, qkv, z, g, beta, states, seq_lens, idx, norm_w, hk, hv, dk,   \
                            dv, scale, lanes, eps);                                            \
  }
INSTANTIATE(DELTA_RULE)
