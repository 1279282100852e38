// atlas-deepseek: the kernels around multi-head latent attention (references in
// atlas_deepseek.mla_reference): latent cache write, query rope, W_UK / W_UV absorption and
// the latent gather of expanded prefill (the attention itself: mla_attention.cu). The latent
// cache holds, per token, the normed latent (rank values) then the rotated rope key (rope
// values) in the activation dtype T.
// cos_sin: [max_pos, rope] float32, cos in the first half, sin in the second.
#include "common.cuh"
#include "mla_common.cuh"

// The rotated value of feature i (< rope) of x, as the reference's rope_rows computes it.
template <typename T>
__device__ __forceinline__ float rope_at(const T* x, int i, int rope, const float* cs, int neox) {
  int half = rope >> 1;
  if (neox) {
    int k = i < half ? i : i - half;
    float c = cs[k], s = cs[half + k];
    float x1 = to_f32(x[k]), x2 = to_f32(x[k + half]);
    return i < half ? x1 * c - x2 * s : x2 * c + x1 * s;
  }
  int k = i >> 1;
  float c = cs[k], s = cs[half + k];
  float x1 = to_f32(x[2 * k]), x2 = to_f32(x[2 * k + 1]);
  return (i & 1) ? x2 * c + x1 * s : x1 * c - x2 * s;
}

// mla_latent_cache: a block per token. RMSNorm of the latent (float32, rounded to T), rope of
// the key (rounded to T), both stored at the token's slot (slot -1: skipped).
template <typename T>
__device__ void mla_latent_cache_impl(T* cache, const T* kv_a, const T* w, const int* pos,
                                      const float* cos_sin, const int* slots, int rank, int rope,
                                      float eps, int neox) {
  __shared__ float scratch[32];
  int t = blockIdx.x, slot = slots[t];
  if (slot < 0) return;
  const T* x = kv_a + (long long)t * (rank + rope);
  T* dst = cache + (long long)slot * (rank + rope);
  float ss = 0.f;
  for (int i = threadIdx.x; i < rank; i += blockDim.x) {
    float v = to_f32(x[i]);
    ss += v * v;
  }
  float inv = rsqrtf(block_sum(ss, scratch) / rank + eps);
  for (int i = threadIdx.x; i < rank; i += blockDim.x)
    dst[i] = from_f32<T>(to_f32(x[i]) * inv * to_f32(w[i]));
  const float* cs = cos_sin + (long long)pos[t] * rope;
  for (int i = threadIdx.x; i < rope; i += blockDim.x)
    dst[rank + i] = from_f32<T>(rope_at(x + rank, i, rope, cs, neox));
}

// mla_rope_query: a block per (token, head). q_nope copied, q_pe rotated; both scaled by
// 1 + beta * log(1 + floor(pos / original)) when beta != 0 (rounded to T before and after).
template <typename T>
__device__ void mla_rope_query_impl(T* q_nope, T* q_pe, const T* q, const int* pos,
                                    const float* cos_sin, int heads, int nope, int rope,
                                    int neox, float beta, int original) {
  int t = blockIdx.x, h = blockIdx.y, p = pos[t];
  const T* src = q + ((long long)t * heads + h) * (nope + rope);
  T* dn = q_nope + ((long long)t * heads + h) * nope;
  T* dp = q_pe + ((long long)t * heads + h) * rope;
  float scale = beta != 0.f ? 1.f + beta * log1pf(floorf((float)p / (float)original)) : 1.f;
  const float* cs = cos_sin + (long long)p * rope;
  for (int i = threadIdx.x; i < nope; i += blockDim.x)
    dn[i] = beta != 0.f ? from_f32<T>(to_f32(src[i]) * scale) : src[i];
  for (int i = threadIdx.x; i < rope; i += blockDim.x) {
    T r = from_f32<T>(rope_at(src + nope, i, rope, cs, neox));
    dp[i] = beta != 0.f ? from_f32<T>(to_f32(r) * scale) : r;
  }
}

// mla_absorb_query: q_lat[t, h, c] = sum_n q_nope[t, h, n] * W[h * (nope + v) + n, c].
// Grid (heads, ceil(rank / 128)), 128 threads (one latent column each), tokens in tiles of 8
// whose queries sit in shared memory, so each W_UK element is read once per tile.
#define ABSORB_TILE 8
template <typename T>
__device__ void mla_absorb_query_impl(T* out, const T* q_nope, const T* w, int ntok, int heads,
                                      int nope, int v, int rank) {
  extern __shared__ float qs[];  // [ABSORB_TILE][nope]
  int h = blockIdx.x, c = blockIdx.y * blockDim.x + threadIdx.x;
  const T* wh = w + (long long)h * (nope + v) * rank;
  for (int t0 = 0; t0 < ntok; t0 += ABSORB_TILE) {
    int nt = min(ABSORB_TILE, ntok - t0);
    __syncthreads();
    for (int i = threadIdx.x; i < nt * nope; i += blockDim.x) {
      int tt = i / nope, n = i - tt * nope;
      qs[i] = to_f32(q_nope[((long long)(t0 + tt) * heads + h) * nope + n]);
    }
    __syncthreads();
    if (c >= rank) continue;
    float acc[ABSORB_TILE];
#pragma unroll
    for (int k = 0; k < ABSORB_TILE; k++) acc[k] = 0.f;
    for (int n = 0; n < nope; n++) {
      float wv = to_f32(wh[(long long)n * rank + c]);
#pragma unroll
      for (int k = 0; k < ABSORB_TILE; k++) acc[k] += qs[k * nope + n] * wv;
    }
    for (int k = 0; k < nt; k++)
      out[((long long)(t0 + k) * heads + h) * rank + c] = from_f32<T>(acc[k]);
  }
}

// mla_absorb_output: out[t, h, j] = W[h * (nope + v) + nope + j, :] . o_lat[t, h, :].
// Grid (heads, ceil(v / 8)), 8 warps: a warp per output feature j keeps its W_UV row in
// registers (rank <= 1024) and walks the tokens.
template <typename T>
__device__ void mla_absorb_output_impl(T* out, const T* o_lat, const T* w, int ntok, int heads,
                                       int nope, int v, int rank) {
  int h = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int j = blockIdx.y * 8 + warp;
  if (j >= v) return;
  const T* row = w + ((long long)h * (nope + v) + nope + j) * rank;
  float wr[MLA_MAX_RANK / 32];
#pragma unroll
  for (int k = 0; k < MLA_MAX_RANK / 32; k++) {
    int c = lane + 32 * k;
    wr[k] = c < rank ? to_f32(row[c]) : 0.f;
  }
  for (int t = 0; t < ntok; t++) {
    const T* o = o_lat + ((long long)t * heads + h) * rank;
    float acc = 0.f;
#pragma unroll
    for (int k = 0; k < MLA_MAX_RANK / 32; k++) {
      int c = lane + 32 * k;
      if (c < rank) acc += wr[k] * to_f32(o[c]);
    }
    acc = warp_sum(acc);
    if (lane == 0) out[((long long)t * heads + h) * v + j] = from_f32<T>(acc);
  }
}

// mla_gather_latent: a block per packed context row; sequence b owns rows from
// sum(seq_lens[:b]). Splits each cached row into the latent and the rope key.
template <typename T>
__device__ void mla_gather_latent_impl(T* c, T* k_pe, const T* cache, const int* tables,
                                       const int* seq_lens, int nseq, int rank, int rope,
                                       int max_blocks, int block_size) {
  int row = blockIdx.x, b = 0, start = 0;
  while (b + 1 < nseq && start + seq_lens[b] <= row) start += seq_lens[b++];
  int j = row - start, width = rank + rope;
  const T* src = cache + ((long long)tables[(long long)b * max_blocks + j / block_size] *
                          block_size + j % block_size) * width;
  for (int i = threadIdx.x; i < width; i += blockDim.x) {
    if (i < rank) c[(long long)row * rank + i] = src[i];
    else k_pe[(long long)row * rope + i - rank] = src[i];
  }
}

#define MLA_KERNELS(T, S)                                                                      \
  extern "C" __global__ void mla_latent_cache_##S(T* cache, const T* kv_a, const T* w,         \
                                                  const int* pos, const float* cs,             \
                                                  const int* slots, int rank, int rope,        \
                                                  float eps, int neox) {                       \
    mla_latent_cache_impl<T>(cache, kv_a, w, pos, cs, slots, rank, rope, eps, neox);           \
  }                                                                                            \
  extern "C" __global__ void mla_rope_query_##S(T* qn, T* qp, const T* q, const int* pos,      \
                                                const float* cs, int heads, int nope,          \
                                                int rope, int neox, float beta,                \
                                                int original) {                                \
    mla_rope_query_impl<T>(qn, qp, q, pos, cs, heads, nope, rope, neox, beta, original);       \
  }                                                                                            \
  extern "C" __global__ void mla_absorb_query_##S(T* out, const T* q, const T* w, int ntok,    \
                                                  int heads, int nope, int v, int rank) {      \
    mla_absorb_query_impl<T>(out, q, w, ntok, heads, nope, v, rank);                           \
  }                                                                                            \
  extern "C" __global__ void mla_absorb_output_##S(T* out, const T* o, const T* w, int ntok,   \
                                                   int heads, int nope, int v, int rank) {     \
    mla_absorb_output_impl<T>(out, o, w, ntok, heads, nope, v, rank);                          \
  }                                                                                            \
  extern "C" __global__ void mla_gather_latent_##S(T* c, T* kpe, const T* cache,               \
                                                   const int* tables, const int* lens,         \
                                                   int nseq, int rank, int rope,               \
                                                   int max_blocks, int bs) {                   \
    mla_gather_latent_impl<T>(c, kpe, cache, tables, lens, nseq, rank, rope, max_blocks, bs);  \
  }
INSTANTIATE(MLA_KERNELS)
