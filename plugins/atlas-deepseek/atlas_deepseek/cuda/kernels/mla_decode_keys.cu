// atlas-deepseek: absorbed MLA decode attention on tensor cores with the warps splitting the
// KEYS of a tile (mma.sync m16n8k16, sm_80+), for latents whose 16-head x RANK accumulator
// fits a warp's registers (Mistral-Small-4, 256 + 64, 32 heads). mla_decode_keys2.cu (warp
// pairs split the output columns too: twice the warps an SM) replaced it as the default; it
// stays as an A/B baseline (ATLAS_MLA_DECODE=keys1), as does mla_decode_mma.cu (the warps
// split the row width; v1). All write the same partials for mla_decode_combine.
//
// Why a second kernel: Mistral-Small-4 does ~58 FLOP per latent byte, so it is bound by the
// latent read, but mla_decode_mma splits each S product over the row width: every warp
// exchanges partial scores through shared memory (one more barrier a tile) and all NW warps
// redo the same online softmax, ~1000 instructions a warp per 64-key tile at one block per SM,
// too slow to keep the HBM stream busy. Here warp (mh, kw) of MH x KW owns heads mh*16.. and
// keys kw*16.. of every BN = 16 * KW key tile, as the dense GQA decode kernel does
// (attention_decode_mma.cu): the full-width S = Q . C^T of its 16 x 16 block (Q by ldmatrix
// from shared memory: it does not fit registers beside O), its own online softmax (exp2
// domain), O += P . C[:, :RANK] over all RANK columns in registers (RANK / 8 n8 tiles: 128
// floats a thread at 256). No score exchange: one barrier a tile, for the cp.async ring.
// After the last tile the KW key-warps of a head tile merge (m, l, O) once, through the
// shared memory the ring and queries used.
//
// Grid (sequence, head group of HT = 16 * MH heads, context split); splits own whole tiles.
// Keys past the split's end are zero-filled by cp.async and masked to -inf; heads past `heads`
// are zero queries whose rows are never written (a warp whose 16 heads all lie past it skips
// the math). A split with no keys writes max -inf, sum 0 and zero rows.
#include "common.cuh"
#include "mma.cuh"
#if ATLAS_MMA
#include "mla_decode_tile.cuh"

template <typename T, int RANK, int ROPE, int MH, int KW>
__device__ void mla_decode_keys_impl(float* part_o, float* part_ml, const T* q_lat,
                                     const T* q_pe, const T* cache, const int* tables,
                                     const int* seq_lens, int heads, int max_blocks,
                                     int block_size, float scale_log2, int splits, int stages) {
  constexpr int W = RANK + ROPE, LD = W + 8;  // row width; padded smem row (no conflicts)
  constexpr int HT = 16 * MH, BN = 16 * KW, THREADS = 32 * MH * KW;
  constexpr int KS = W / 16, ND = RANK / 8;  // S k-steps; O n8 tiles
  static_assert(W % 16 == 0 && RANK % 16 == 0, "whole k-steps of S, n8 pairs of O");
  extern __shared__ __align__(16) unsigned char mla_keys_smem[];
  T* sq = reinterpret_cast<T*>(mla_keys_smem);             // [HT][LD]
  T* skv = sq + HT * LD;                                   // [stages][BN][LD]
  float* sacc = reinterpret_cast<float*>(mla_keys_smem);   // after the loop: [KW][HT][RANK + 8]
  __shared__ float sm_m[KW][HT], sm_l[KW][HT], sm_w[KW][HT];

  int b = blockIdx.x, h0 = blockIdx.y * HT, split = blockIdx.z;
  int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, mh = warp % MH, kw = warp / MH;
  int k0, k1, ntiles;
  mla_split_keys<BN>(seq_lens[b], splits, split, k0, k1, ntiles);
  const MlaTileGather<T, W, BN, THREADS> gather(cache, tables + (long long)b * max_blocks,
                                                block_size, k1);
  mla_load_queries<T, RANK, ROPE, HT, THREADS>(sq, q_lat, q_pe, b, h0, heads, tid);
  auto load = [&](int buf, int tile) { gather(skv + buf * BN * LD, k0 + tile * BN, tid); };
  mla_ring_prime(stages, ntiles, load);

  float o[ND][4], m[2] = {NEG_INF, NEG_INF}, l[2] = {0.f, 0.f};
#pragma unroll
  for (int n = 0; n < ND; n++)
#pragma unroll
    for (int e = 0; e < 4; e++) o[n][e] = 0.f;
  const int kb = kw * 16, mi = lane >> 3;
  const bool active = h0 + mh * 16 < heads;  // warp-uniform
  const T* qrow = sq + (mh * 16 + (lane & 15)) * LD + (lane >> 4) * 8;

  for (int it = 0; it < ntiles; it++) {
    mla_wait_ring(stages);
    __syncthreads();  // every copy visible; every warp done with tile it - 1's buffer
    mla_ring_next(it, stages, ntiles, load);
    int j0 = k0 + it * BN + kb;  // this warp's first key
    if (!active || j0 >= k1) continue;  // warp-uniform: no heads or no keys of its own
    const T* tile = skv + (it % stages) * BN * LD;

    // S = Q . C^T for 16 heads x 16 keys; even / odd k-steps in separate accumulators so
    // four mma chains, not two, hide the tensor-core latency.
    float sa[2][2][4];
#pragma unroll
    for (int p = 0; p < 2; p++)
#pragma unroll
      for (int n = 0; n < 2; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) sa[p][n][e] = 0.f;
    const T* krow = tile + (kb + (mi >> 1) * 8 + (lane & 7)) * LD + (mi & 1) * 8;
#pragma unroll
    for (int kk = 0; kk < KS; kk++) {
      u32 a[4], t[4];
      ldmatrix_x4(a, qrow + kk * 16);
      ldmatrix_x4(t, krow + kk * 16);
      u32 b0[2] = {t[0], t[1]}, b1[2] = {t[2], t[3]};
      mma16816<T>(sa[kk & 1][0], a, b0);
      mma16816<T>(sa[kk & 1][1], a, b1);
    }
    float s[2][4];
#pragma unroll
    for (int n = 0; n < 2; n++)
#pragma unroll
      for (int e = 0; e < 4; e++) s[n][e] = sa[0][n][e] + sa[1][n][e];
    mma_softmax_step(s, m, l, o, j0, k1, scale_log2, lane);
    mma_pv_16keys<T>(o, s, tile + (kb + (lane & 7) + ((lane >> 3) & 1) * 8) * LD +
                               (lane >> 4) * 8);
  }
  asm volatile("cp.async.wait_group 0;\n");
  __syncthreads();  // every warp is done with q and the ring: they become the merge buffer
  mla_merge_key_groups<RANK, HT, KW, THREADS>(sacc, sm_m, sm_l, sm_w, o, m, l, active, true,
                                              mh * 16 + (lane >> 2), kw, 0, part_o, part_ml,
                                              b, splits, split, h0, heads, lane, tid);
}

// One kernel per latent shape, named mla_decode_keys_r<RANK>_<dtype>; the launch parameters
// (heads per block 16 * MH, MH * KW warps, 16 * KW keys a tile) are KEYS_DECODE_CONFIGS in
// atlas_deepseek/cuda/mla_decode_plan.py and must match these (test_mla_decode_plan.py).
#define MLA_KEYS_ONE(T, S, RANK, ROPE, MH, KW)                                                 \
  extern "C" __global__ void __launch_bounds__(32 * MH * KW, 1) mla_decode_keys_r##RANK##_##S( \
      float* po, float* pml, const T* ql, const T* qp, const T* cache, const int* tables,      \
      const int* lens, int heads, int max_blocks, int bs, float scale_log2, int splits,        \
      int stages) {                                                                            \
    mla_decode_keys_impl<T, RANK, ROPE, MH, KW>(po, pml, ql, qp, cache, tables, lens, heads,   \
                                                max_blocks, bs, scale_log2, splits, stages);   \
  }
// Mistral-Small-4 (256 + 64): 32 heads (two m16 tiles), 4 key-warps each, 64-key tiles.
#define MLA_KEYS(T, S) MLA_KEYS_ONE(T, S, 256, 64, 2, 4)
INSTANTIATE(MLA_KEYS)
#endif
