// atlas-deepseek: the attention kernels of multi-head latent attention (references
// mla_absorbed_attention and mla_expanded_attention in atlas_deepseek.mla_reference): absorbed
// attention over the paged latent cache (a block per query token and head; decode steps take
// the split kernel and its combine), and prefill over expanded keys and values.
#include "common.cuh"
#include "mla_common.cuh"

// mla_absorbed_attention: a block per (query token, head), 4 warps splitting the keys; each
// warp keeps an online softmax over its keys and a latent accumulator (lane owns features
// lane + 32 k), then the warps merge through shared memory. Every head reads the same rows,
// which mostly hit L2 after the first head.
template <typename T>
__device__ void mla_absorbed_attention_impl(T* out, const T* q_lat, const T* q_pe,
                                            const T* cache, const int* tables,
                                            const int* seq_lens, const int* cu, int nseq,
                                            int heads, int rank, int rope, int max_blocks,
                                            int block_size, float scale) {
  extern __shared__ float sm[];  // q: [rank + rope]; merge: [MLA_WARPS][rank + 2]
  float* qs = sm;
  float* merge = sm + rank + rope;
  int t = blockIdx.x, h = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int b = 0;
  while (b + 1 < nseq && cu[b + 1] <= t) b++;
  int n_q = cu[b + 1] - cu[b], len = seq_lens[b];
  int last = len - n_q + (t - cu[b]);  // this query's position: keys 0..last
  const T* ql = q_lat + ((long long)t * heads + h) * rank;
  const T* qp = q_pe + ((long long)t * heads + h) * rope;
  for (int i = threadIdx.x; i < rank; i += blockDim.x) qs[i] = to_f32(ql[i]);
  for (int i = threadIdx.x; i < rope; i += blockDim.x) qs[rank + i] = to_f32(qp[i]);
  __syncthreads();
  const int* table = tables + (long long)b * max_blocks;
  int width = rank + rope;
  float m = NEG_INF, l = 0.f, acc[MLA_MAX_RANK / 32];
#pragma unroll
  for (int k = 0; k < MLA_MAX_RANK / 32; k++) acc[k] = 0.f;
  for (int j = warp; j <= last; j += MLA_WARPS) {
    const T* row = cache + ((long long)table[j / block_size] * block_size + j % block_size) * width;
    float s = 0.f;
    for (int i = lane; i < width; i += 32) s += qs[i] * to_f32(row[i]);
    s = warp_sum(s) * scale;
    float m2 = fmaxf(m, s), corr = __expf(m - m2), p = __expf(s - m2);
    l = l * corr + p;
#pragma unroll
    for (int k = 0; k < MLA_MAX_RANK / 32; k++) {
      int c = lane + 32 * k;
      if (c < rank) acc[k] = acc[k] * corr + p * to_f32(row[c]);
    }
    m = m2;
  }
  float* mine = merge + warp * (rank + 2);
#pragma unroll
  for (int k = 0; k < MLA_MAX_RANK / 32; k++) {
    int c = lane + 32 * k;
    if (c < rank) mine[c] = acc[k];
  }
  if (lane == 0) { mine[rank] = m; mine[rank + 1] = l; }
  __syncthreads();
  float mt = NEG_INF;
  for (int w = 0; w < MLA_WARPS; w++) mt = fmaxf(mt, merge[w * (rank + 2) + rank]);
  float lt = 0.f;
  for (int w = 0; w < MLA_WARPS; w++) {
    float mw = merge[w * (rank + 2) + rank];
    lt += mw == NEG_INF ? 0.f : merge[w * (rank + 2) + rank + 1] * __expf(mw - mt);
  }
  T* dst = out + ((long long)t * heads + h) * rank;
  for (int c = threadIdx.x; c < rank; c += blockDim.x) {
    float o = 0.f;
    for (int w = 0; w < MLA_WARPS; w++) {
      float mw = merge[w * (rank + 2) + rank];
      if (mw != NEG_INF) o += merge[w * (rank + 2) + c] * __expf(mw - mt);
    }
    dst[c] = from_f32<T>(o / lt);
  }
}

// mla_decode_split: decode steps (one query per sequence). Grid (seq, head group of
// 2 * DEC_WARPS heads, split of the context). The block stages DEC_TILE latent rows at a time
// in shared memory (read once from memory for all its heads); each warp owns two heads: their
// queries (lane i holds features i + 32 k) and latent accumulators stay in registers, with an
// online softmax per head. Writes unnormalised partials (acc, max, sum) per split for
// mla_decode_combine. Latent <= DEC_MAX_RANK and latent + rope <= DEC_MAX_W (DeepSeek-V3,
// Kimi-K2, Mistral-Small-4); wider ones take mla_absorbed_attention.
#define DEC_WARPS 8
#define DEC_TILE 16
#define DEC_MAX_RANK 512
#define DEC_MAX_W 576
template <typename T>
__device__ void mla_decode_split_impl(float* part_o, float* part_ml, const T* q_lat,
                                      const T* q_pe, const T* cache, const int* tables,
                                      const int* seq_lens, int heads, int rank, int rope,
                                      int max_blocks, int block_size, float scale, int splits) {
  extern __shared__ unsigned char raw[];
  T* tile = reinterpret_cast<T*>(raw);  // [DEC_TILE][width]
  int b = blockIdx.x, split = blockIdx.z, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int width = rank + rope, len = seq_lens[b];
  int chunk = (len + splits - 1) / splits;
  int k0 = split * chunk, k1 = min(len, k0 + chunk);
  int h0 = blockIdx.y * 2 * DEC_WARPS + 2 * warp;
  float q[2][DEC_MAX_W / 32], acc[2][DEC_MAX_RANK / 32], m[2], l[2];
#pragma unroll
  for (int j = 0; j < 2; j++) {
    int h = min(h0 + j, heads - 1);
    const T* ql = q_lat + ((long long)b * heads + h) * rank;
    const T* qp = q_pe + ((long long)b * heads + h) * rope;
#pragma unroll
    for (int k = 0; k < DEC_MAX_W / 32; k++) {
      int i = lane + 32 * k;
      q[j][k] = i < rank ? to_f32(ql[i]) : (i < width ? to_f32(qp[i - rank]) : 0.f);
    }
#pragma unroll
    for (int k = 0; k < DEC_MAX_RANK / 32; k++) acc[j][k] = 0.f;
    m[j] = NEG_INF;
    l[j] = 0.f;
  }
  const int* table = tables + (long long)b * max_blocks;
  for (int t0 = k0; t0 < k1; t0 += DEC_TILE) {
    int nt = min(DEC_TILE, k1 - t0);
    __syncthreads();
    for (int i = threadIdx.x; i < nt * width; i += blockDim.x) {
      int r = i / width, c = i - r * width, j = t0 + r;
      tile[i] = cache[((long long)table[j / block_size] * block_size + j % block_size) * width + c];
    }
    __syncthreads();
    for (int r = 0; r < nt; r++) {
      const T* row = tile + r * width;
      float x[DEC_MAX_W / 32];
#pragma unroll
      for (int k = 0; k < DEC_MAX_W / 32; k++) {
        int i = lane + 32 * k;
        x[k] = i < width ? to_f32(row[i]) : 0.f;
      }
#pragma unroll
      for (int j = 0; j < 2; j++) {
        float s = 0.f;
#pragma unroll
        for (int k = 0; k < DEC_MAX_W / 32; k++) s += q[j][k] * x[k];
        s = warp_sum(s) * scale;
        float m2 = fmaxf(m[j], s), corr = __expf(m[j] - m2), p = __expf(s - m2);
        l[j] = l[j] * corr + p;
#pragma unroll
        for (int k = 0; k < DEC_MAX_RANK / 32; k++) acc[j][k] = acc[j][k] * corr + p * x[k];
        m[j] = m2;
      }
    }
  }
#pragma unroll
  for (int j = 0; j < 2; j++) {
    int h = h0 + j;
    if (h >= heads) continue;
    long long at = ((long long)b * splits + split) * heads + h;
#pragma unroll
    for (int k = 0; k < DEC_MAX_RANK / 32; k++) {
      int c = lane + 32 * k;
      if (c < rank) part_o[at * rank + c] = acc[j][k];
    }
    if (lane == 0) { part_ml[2 * at] = m[j]; part_ml[2 * at + 1] = l[j]; }
  }
}

// mla_decode_combine: merges the splits' partials of either decode kernel. Grid (seq, head,
// chunk of COMB_COLS latent columns), COMB_THREADS threads. Why this shape: at batch 1 the
// decode kernels write up to ~128 splits, and one thread walking every split serially (with a
// dependent global load per step) cost more than the attention itself. Here the threads split
// the splits: max and sum are block reductions, each split's factor exp(m_s - m) / l is
// computed once into shared memory, then every warp sums its share of the splits over the
// chunk (a lane owns 4 columns: one float4 a split) and the warps meet in shared memory.
// Empty splits (max -inf) weigh 0; their partial rows are zeros, never NaN.
#define COMB_THREADS 256
#define COMB_COLS 128
#define COMB_MAX_SPLITS 256
template <typename T>
__device__ void mla_decode_combine_impl(T* out, const float* part_o, const float* part_ml,
                                        int heads, int rank, int splits) {
  constexpr int NWARP = COMB_THREADS / 32;
  __shared__ float wt[COMB_MAX_SPLITS], scratch[32];
  __shared__ __align__(16) float acc[NWARP][COMB_COLS];
  int b = blockIdx.x, h = blockIdx.y, c0 = blockIdx.z * COMB_COLS;
  int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  long long at0 = (long long)b * splits * heads + h;  // split s: row at0 + s * heads
  float mx = NEG_INF;
  for (int s = tid; s < splits; s += COMB_THREADS)
    mx = fmaxf(mx, part_ml[2 * (at0 + (long long)s * heads)]);
  mx = block_max(mx, scratch);
  float lsum = 0.f;
  for (int s = tid; s < splits; s += COMB_THREADS) {
    long long at = at0 + (long long)s * heads;
    float ms = part_ml[2 * at];
    float e = ms == NEG_INF ? 0.f : __expf(ms - mx);
    wt[s] = e;
    lsum += e * part_ml[2 * at + 1];
  }
  float inv = 1.f / block_sum(lsum, scratch);  // its barriers publish wt
  int c = c0 + lane * 4;
  float a[4] = {0.f, 0.f, 0.f, 0.f};
  if (c < rank) {
    if (rank % 4 == 0) {  // whole float4 columns, 16-byte aligned rows
#pragma unroll 4
      for (int s = warp; s < splits; s += NWARP) {
        const float* p = part_o + (at0 + (long long)s * heads) * rank + c;
        float4 v = *reinterpret_cast<const float4*>(p);
        float ws = wt[s];
        a[0] += ws * v.x; a[1] += ws * v.y; a[2] += ws * v.z; a[3] += ws * v.w;
      }
    } else {
      for (int s = warp; s < splits; s += NWARP) {
        const float* p = part_o + (at0 + (long long)s * heads) * rank + c;
        float ws = wt[s];
#pragma unroll
        for (int e = 0; e < 4; e++)
          if (c + e < rank) a[e] += ws * p[e];
      }
    }
  }
  *reinterpret_cast<float4*>(&acc[warp][lane * 4]) = make_float4(a[0], a[1], a[2], a[3]);
  __syncthreads();
  for (int i = tid; i < COMB_COLS; i += COMB_THREADS) {
    if (c0 + i >= rank) break;
    float o = 0.f;
#pragma unroll
    for (int w = 0; w < NWARP; w++) o += acc[w][i];
    out[((long long)b * heads + h) * rank + c0 + i] = from_f32<T>(o * inv);
  }
}

// mla_expanded_attention: prefill with expanded keys and values. A block per (query token,
// head), 4 warps over the keys with an online softmax each (lane owns value features
// lane + 32 k), merged through shared memory as in mla_absorbed_attention.
#define EXP_MAX_V 256
template <typename T>
__device__ void mla_expanded_attention_impl(T* out, const T* q_nope, const T* q_pe, const T* kv,
                                            const T* k_pe, const int* seq_lens, const int* cu,
                                            int nseq, int heads, int nope, int rope, int v,
                                            float scale) {
  extern __shared__ float sm[];  // q: [nope + rope]; merge: [MLA_WARPS][v + 2]
  float* qs = sm;
  float* merge = sm + nope + rope;
  int t = blockIdx.x, h = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int b = 0, start = 0;
  while (b + 1 < nseq && cu[b + 1] <= t) start += seq_lens[b++];
  int n_q = cu[b + 1] - cu[b], len = seq_lens[b];
  int last = len - n_q + (t - cu[b]);
  for (int i = threadIdx.x; i < nope; i += blockDim.x)
    qs[i] = to_f32(q_nope[((long long)t * heads + h) * nope + i]);
  for (int i = threadIdx.x; i < rope; i += blockDim.x)
    qs[nope + i] = to_f32(q_pe[((long long)t * heads + h) * rope + i]);
  __syncthreads();
  float m = NEG_INF, l = 0.f, acc[EXP_MAX_V / 32];
#pragma unroll
  for (int k = 0; k < EXP_MAX_V / 32; k++) acc[k] = 0.f;
  for (int j = warp; j <= last; j += MLA_WARPS) {
    const T* row = kv + ((long long)(start + j) * heads + h) * (nope + v);
    const T* pe = k_pe + (long long)(start + j) * rope;
    float s = 0.f;
    for (int i = lane; i < nope; i += 32) s += qs[i] * to_f32(row[i]);
    for (int i = lane; i < rope; i += 32) s += qs[nope + i] * to_f32(pe[i]);
    s = warp_sum(s) * scale;
    float m2 = fmaxf(m, s), corr = __expf(m - m2), p = __expf(s - m2);
    l = l * corr + p;
#pragma unroll
    for (int k = 0; k < EXP_MAX_V / 32; k++) {
      int c = lane + 32 * k;
      if (c < v) acc[k] = acc[k] * corr + p * to_f32(row[nope + c]);
    }
    m = m2;
  }
  float* mine = merge + warp * (v + 2);
#pragma unroll
  for (int k = 0; k < EXP_MAX_V / 32; k++) {
    int c = lane + 32 * k;
    if (c < v) mine[c] = acc[k];
  }
  if (lane == 0) { mine[v] = m; mine[v + 1] = l; }
  __syncthreads();
  float mt = NEG_INF, lt = 0.f;
  for (int w = 0; w < MLA_WARPS; w++) mt = fmaxf(mt, merge[w * (v + 2) + v]);
  for (int w = 0; w < MLA_WARPS; w++) {
    float mw = merge[w * (v + 2) + v];
    lt += mw == NEG_INF ? 0.f : merge[w * (v + 2) + v + 1] * __expf(mw - mt);
  }
  T* dst = out + ((long long)t * heads + h) * v;
  for (int c = threadIdx.x; c < v; c += blockDim.x) {
    float o = 0.f;
    for (int w = 0; w < MLA_WARPS; w++) {
      float mw = merge[w * (v + 2) + v];
      if (mw != NEG_INF) o += merge[w * (v + 2) + c] * __expf(mw - mt);
    }
    dst[c] = from_f32<T>(o / lt);
  }
}

#define MLA_ATTENTION_KERNELS(T, S)                                                            \
  extern "C" __global__ void mla_absorbed_attention_##S(                                       \
      T* out, const T* ql, const T* qp, const T* cache, const int* tables, const int* lens,    \
      const int* cu, int nseq, int heads, int rank, int rope, int max_blocks, int bs,          \
      float scale) {                                                                           \
    mla_absorbed_attention_impl<T>(out, ql, qp, cache, tables, lens, cu, nseq, heads, rank,    \
                                   rope, max_blocks, bs, scale);                               \
  }                                                                                            \
  extern "C" __global__ void mla_decode_split_##S(                                             \
      float* po, float* pml, const T* ql, const T* qp, const T* cache, const int* tables,      \
      const int* lens, int heads, int rank, int rope, int max_blocks, int bs, float scale,     \
      int splits) {                                                                            \
    mla_decode_split_impl<T>(po, pml, ql, qp, cache, tables, lens, heads, rank, rope,          \
                             max_blocks, bs, scale, splits);                                   \
  }                                                                                            \
  extern "C" __global__ void mla_decode_combine_##S(T* out, const float* po, const float* pml, \
                                                    int heads, int rank, int splits) {         \
    mla_decode_combine_impl<T>(out, po, pml, heads, rank, splits);                             \
  }                                                                                            \
  extern "C" __global__ void mla_expanded_attention_##S(                                       \
      T* out, const T* qn, const T* qp, const T* kv, const T* kpe, const int* lens,            \
      const int* cu, int nseq, int heads, int nope, int rope, int v, float scale) {            \
    mla_expanded_attention_impl<T>(out, qn, qp, kv, kpe, lens, cu, nseq, heads, nope, rope,    \
                                   v, scale);                                                  \
  }
INSTANTIATE(MLA_ATTENTION_KERNELS)
