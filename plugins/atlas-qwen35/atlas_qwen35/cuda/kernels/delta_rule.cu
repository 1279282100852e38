// Gated delta rule over packed variable-length sequences, token by token, float32 state.
// Per value head h (key head h / (Hv / Hk)), with q, k optionally L2-normalised and q scaled:
//   S = exp(g_t) S;  S += k_t (beta_t (v_t - S^T k_t))^T;  o_t = S^T q_t
// Columns of S ([Dk, Dv]) evolve independently, so a block owns a slab of columns of one
// (sequence, head): `lanes` threads share a column (rows r, r + lanes, ...; at most
// DR_ROWS each, kept in registers) and reduce over it with shuffles. Grid
// (ceil(Dv / (blockDim / lanes)), Hv, num_seqs); dynamic shared memory 4 * Dk floats (q and k
// of the current and the next token). Serves decode and, as a first version, prefill.
#include "common.cuh"
#include "cluster.cuh"

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

// The same decode step with a value head's columns split over a thread block cluster (sm_90+),
// so that Hv * Dv / cols blocks share the state traffic instead of Hv. A block owns `cols`
// columns of head h (state slab [Dk, cols]); a thread a float4 of them (quad t % (cols / 4))
// on rows rg, rg + R, ... (rg = t / (cols / 4), R = blockDim / (cols / 4), at most DS_ROWS
// each): both reductions over Dk are warp shuffles then one shared-memory pass over the warps.
// A cluster is the Dv / cols blocks of one (head, sequence), grid (Dv / cols, Hv, num_seqs):
// each block pushes its squared-output sum into every member's shared memory, one cluster
// barrier, then all normalise. Before griddepcontrol.wait the block loads its state slab into
// registers (state_indices and seq_lens are uploaded by the host, never written by a kernel;
// the slab was last written by an earlier launch), so only q/k/v, z, g and beta wait (H200
// qwen3.5-35b-a3b batch 1 with the conv's pre-wait loads: 423.0 -> 432.5 tok/s). Dynamic
// shared memory 2 * Dk floats.
#define DS_ROWS 8
#define DS_MAX_WARPS 8
#define DS_MAX_COLS 64
#define DS_MAX_CLUSTER 8

__device__ __forceinline__ float4 f4_fma(float4 a, float s, float4 acc) {
  return make_float4(fmaf(a.x, s, acc.x), fmaf(a.y, s, acc.y), fmaf(a.z, s, acc.z),
                     fmaf(a.w, s, acc.w));
}

// Per-column sums of v over the block's row groups (every thread gets its quad's sums).
__device__ __forceinline__ float4 ds_column_sum(float4 v, float* red, int cq, int quad) {
  for (int o = cq; o < 32; o <<= 1) {
    v.x += __shfl_xor_sync(0xffffffffu, v.x, o);
    v.y += __shfl_xor_sync(0xffffffffu, v.y, o);
    v.z += __shfl_xor_sync(0xffffffffu, v.z, o);
    v.w += __shfl_xor_sync(0xffffffffu, v.w, o);
  }
  float4* red4 = reinterpret_cast<float4*>(red);
  int warp = threadIdx.x >> 5;
  if ((threadIdx.x & 31) < cq) red4[warp * cq + quad] = v;
  __syncthreads();
  float4 sum = red4[quad];
  for (int w = 1; w < (int)(blockDim.x >> 5); w++) {
    float4 p = red4[w * cq + quad];
    sum.x += p.x; sum.y += p.y; sum.z += p.z; sum.w += p.w;
  }
  return sum;
}

template <typename T>
__device__ void gdn_decode_split_impl(T* out, const T* qkv, const T* z, const float* g,
                                      const float* beta, float* states, const int* seq_lens,
                                      const int* state_indices, const T* norm_w, int num_k_heads,
                                      int num_v_heads, int dk, int dv, int cols, float scale,
                                      float eps) {
  extern __shared__ float qk[];  // q (dk), k (dk)
  __shared__ __align__(16) float red_kv[DS_MAX_WARPS * DS_MAX_COLS];
  __shared__ __align__(16) float red_o[DS_MAX_WARPS * DS_MAX_COLS];
  __shared__ float parts[DS_MAX_CLUSTER];
  int b = blockIdx.z, h = blockIdx.y, cq = cols >> 2, quad = threadIdx.x % cq;
  int rg = threadIdx.x / cq, R = blockDim.x / cq, j = blockIdx.x * cols + quad * 4;
  long long head = (long long)b * num_v_heads + h;
  cluster_arrive(true);  // #1: this block runs, its shared memory may be written
  pdl_trigger();
  // Before the wait: the slot and length (host-written), this block's state slab (written by
  // this layer's kernel of an earlier step, an earlier launch) and the norm weight (static)
  // into registers; after it only what the projections and gating wrote.
  int slot = state_indices[b];
  bool has_state = slot >= 0 && seq_lens[b] > 1;
  float4* sp = reinterpret_cast<float4*>(
      states + ((long long)(slot < 0 ? 0 : slot) * num_v_heads + h) * dk * dv + j);
  int dv4 = dv >> 2;
  float4 s[DS_ROWS];
#pragma unroll
  for (int m = 0; m < DS_ROWS; m++) {
    int i = rg + R * m;
    s[m] = has_state && i < dk ? sp[(long long)i * dv4] : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  float w[4];
#pragma unroll
  for (int c = 0; c < 4; c++) w[c] = to_f32(norm_w[j + c]);
  pdl_wait();
  int kh = h / (num_v_heads / num_k_heads);
  const T* row = qkv + (long long)b * (2LL * num_k_heads * dk + (long long)num_v_heads * dv);
  load_qk(qk, row, kh * dk, num_k_heads * dk + kh * dk, dk);
  float v[4], zv[4];
#pragma unroll
  for (int c = 0; c < 4; c++) {
    v[c] = to_f32(row[2LL * num_k_heads * dk + (long long)h * dv + j + c]);
    zv[c] = to_f32(z[head * dv + j + c]);
  }
  float decay = expf(g[head]), bt = beta[head];
  __syncthreads();
  float qscale = scale * rsqrtf(warp_sumsq(qk, dk) + 1e-6f);
  float kscale = rsqrtf(warp_sumsq(qk + dk, dk) + 1e-6f);
  float4 kv = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
  for (int m = 0; m < DS_ROWS; m++) {
    int i = rg + R * m;
    if (i < dk) {
      s[m] = make_float4(s[m].x * decay, s[m].y * decay, s[m].z * decay, s[m].w * decay);
      kv = f4_fma(s[m], qk[dk + i], kv);
    }
  }
  kv = ds_column_sum(kv, red_kv, cq, quad);
  float4 delta = make_float4((v[0] - kv.x * kscale) * bt * kscale,
                             (v[1] - kv.y * kscale) * bt * kscale,
                             (v[2] - kv.z * kscale) * bt * kscale,
                             (v[3] - kv.w * kscale) * bt * kscale);
  float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
  for (int m = 0; m < DS_ROWS; m++) {
    int i = rg + R * m;
    if (i < dk) {
      s[m] = f4_fma(delta, qk[dk + i], s[m]);
      o = f4_fma(s[m], qk[i], o);
      if (slot >= 0) sp[(long long)i * dv4] = s[m];
    }
  }
  o = ds_column_sum(o, red_o, cq, quad);
  float oc[4] = {to_f32(from_f32<T>(o.x * qscale)), to_f32(from_f32<T>(o.y * qscale)),
                 to_f32(from_f32<T>(o.z * qscale)), to_f32(from_f32<T>(o.w * qscale))};
  float sq = 0.f;
  if (threadIdx.x < 32) {
    if (threadIdx.x < cq) sq = oc[0] * oc[0] + oc[1] * oc[1] + oc[2] * oc[2] + oc[3] * oc[3];
    sq = warp_sum(sq);
  }
  u32 rank, csize;
  cluster_rank(rank, csize);
  cluster_wait();  // #1: every member has started
  if (threadIdx.x < csize) cluster_store_f32(&parts[rank], threadIdx.x, sq);
  cluster_arrive(false);  // #2: this block's sum is in every member
  cluster_wait();
  if (threadIdx.x >= cq) return;
  float total = 0.f;
  for (u32 r = 0; r < csize; r++) total += parts[r];
  float inv = rsqrtf(total / dv + eps);
#pragma unroll
  for (int c = 0; c < 4; c++)
    out[head * dv + j + c] = from_f32<T>(oc[c] * inv * w[c] * (zv[c] / (1.f + expf(-zv[c]))));
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
  }                                                                                            \
  extern "C" __global__ void __launch_bounds__(256) gdn_decode_split_##S(                      \
      T* out, const T* qkv, const T* z, const float* g, const float* beta, float* states,      \
      const int* seq_lens, const int* idx, const T* norm_w, int hk, int hv, int dk, int dv,    \
      int cols, float scale, float eps) {                                                      \
    gdn_decode_split_impl<T>(out, qkv, z, g, beta, states, seq_lens, idx, norm_w, hk, hv, dk,  \
                             dv, cols, scale, eps);                                            \
  }
INSTANTIATE(DELTA_RULE)
