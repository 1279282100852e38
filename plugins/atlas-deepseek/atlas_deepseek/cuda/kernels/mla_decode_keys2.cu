// atlas-deepseek: absorbed MLA decode attention on tensor cores (mma.sync m16n8k16, sm_80+)
// with the keys of a tile split over warp PAIRS and the output columns over the two warps of a
// pair: the default decode kernel at Mistral-Small-4's 256 + 64 latent (32 heads).
// mla_decode_keys.cu (ATLAS_MLA_DECODE=keys1) and mla_decode_mma.cu (v1) stay for A/B runs;
// all three write the same partials for mla_decode_combine.
//
// Why a third kernel: mla_decode_keys gives each warp 16 heads x all RANK output columns (128
// fp32 accumulators a thread, 232 registers), so an SM holds 8 warps, and each warp's chain
// (20 score k-steps -> online softmax -> 32 value n8 tiles) is latency-bound: ~40% of the latent
// read floor at batch 32. Here pair (mh, kw) of MH x KW owns heads mh*16.. and keys kw*16.. of
// every BN = 16 * KW key tile, and warp hf of the pair:
//   - computes the score partial of its half of the row (k-steps hf * KS/2 ..), writes it
//     (8 floats a thread) to shared memory, waits on the pair's named barrier (bar.sync 1 + pair,
//     64 threads: no block barrier) and adds the other half's partial. Both warps add the two
//     halves in the same order (half 0 first), so their scores, max and sum are bit-identical
//     and their online softmaxes never drift apart;
//   - accumulates only output columns hf * RANK/2 .. (64 floats a thread at 256).
// That fits 128 registers, so 16 warps share an SM: one block of MH x KW = 2 x 4 pairs over
// 64-key tiles (mla_decode_keys2), or two blocks of 2 x 2 pairs over 32-key tiles
// (mla_decode_keys2x2). The exchange buffer is single: a warp writes tile it + 1's partial only
// after the block barrier that opens tile it + 1, which its partner reaches after reading tile
// it's partial. After the last tile the KW key-pairs of a head tile merge (m, l, O) once, each
// warp storing its own columns, through the shared memory the ring and queries used.
//
// Grid (sequence, head group of HT = 16 * MH heads, context split); splits own whole tiles.
// Keys past the split's end are zero-filled by cp.async and masked to -inf; heads past `heads`
// are zero queries whose rows are never written (a pair whose 16 heads all lie past it skips
// the math). A split with no keys writes max -inf, sum 0 and zero rows.
#include "common.cuh"
#include "mma.cuh"
#if ATLAS_MMA
#include "mla_decode_tile.cuh"

// Waits for the two warps (64 threads) of pair `pair` (warp-uniform) on barrier 1 + pair
// (0 is __syncthreads'). Immediate ids: with a register id ptxas reserves all 16 barriers of
// the block, which may cost the second resident block of mla_decode_keys2x2; ids past PAIRS
// are compiled out so that kernel reserves only 5.
#define MLA_PAIR_BAR(p, id) \
  case p: if (p < PAIRS) asm volatile("bar.sync " #id ", 64;\n" ::: "memory"); break;
template <int PAIRS>
__device__ __forceinline__ void pair_sync(int pair) {
  switch (pair) {
    MLA_PAIR_BAR(0, 1) MLA_PAIR_BAR(1, 2) MLA_PAIR_BAR(2, 3) MLA_PAIR_BAR(3, 4)
    MLA_PAIR_BAR(4, 5) MLA_PAIR_BAR(5, 6) MLA_PAIR_BAR(6, 7) MLA_PAIR_BAR(7, 8)
  }
}

template <typename T, int RANK, int ROPE, int MH, int KW>
__device__ void mla_decode_keys2_impl(float* part_o, float* part_ml, const T* q_lat,
                                      const T* q_pe, const T* cache, const int* tables,
                                      const int* seq_lens, int heads, int max_blocks,
                                      int block_size, float scale_log2, int splits, int stages) {
  constexpr int W = RANK + ROPE, LD = W + 8;  // row width; padded smem row (no conflicts)
  constexpr int HT = 16 * MH, BN = 16 * KW, PAIRS = MH * KW, THREADS = 64 * PAIRS;
  constexpr int KH = W / 32;  // score k-steps of a half row
  constexpr int HALF = RANK / 2, ND = HALF / 8;  // a warp's output columns and their n8 tiles
  static_assert(W % 32 == 0 && HALF % 16 == 0, "whole k-steps per half row, n8 pairs of O");
  static_assert(PAIRS <= 8, "one named barrier per pair (pair_sync has 8)");
  extern __shared__ __align__(16) unsigned char mla_keys2_smem[];
  T* sq = reinterpret_cast<T*>(mla_keys2_smem);             // [HT][LD]
  T* skv = sq + HT * LD;                                    // [stages][BN][LD]
  float* sx = reinterpret_cast<float*>(skv + stages * BN * LD);  // [PAIRS][2][8][32]
  float* sacc = reinterpret_cast<float*>(mla_keys2_smem);   // after: [KW][HT][RANK + 8]
  __shared__ float sm_m[KW][HT], sm_l[KW][HT], sm_w[KW][HT];

  int b = blockIdx.x, h0 = blockIdx.y * HT, split = blockIdx.z;
  int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  int hf = warp & 1, pair = warp >> 1, mh = pair % MH, kw = pair / MH;
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
  const bool active = h0 + mh * 16 < heads;  // pair-uniform
  const T* qrow = sq + (mh * 16 + (lane & 15)) * LD + (lane >> 4) * 8 + hf * KH * 16;
  // Lane i of both warps holds the same (head, key) elements of the 16 x 16 block, so each
  // writes and reads element e at [e][lane]: conflict-free, no index remapping.
  float* mine = sx + (pair * 2 + hf) * 8 * 32 + lane;
  const float* theirs = sx + (pair * 2 + (hf ^ 1)) * 8 * 32 + lane;

  for (int it = 0; it < ntiles; it++) {
    mla_wait_ring(stages);
    __syncthreads();  // copies visible; tile it - 1's buffer and exchange partials all read
    mla_ring_next(it, stages, ntiles, load);
    int j0 = k0 + it * BN + kb;  // this pair's first key
    if (!active || j0 >= k1) continue;  // pair-uniform: no heads or no keys of its own
    const T* tile = skv + (it % stages) * BN * LD;

    // This half's S partial for 16 heads x 16 keys; even / odd k-steps in separate
    // accumulators so four mma chains, not two, hide the tensor-core latency.
    float sa[2][2][4];
#pragma unroll
    for (int p = 0; p < 2; p++)
#pragma unroll
      for (int n = 0; n < 2; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) sa[p][n][e] = 0.f;
    const T* krow = tile + (kb + (mi >> 1) * 8 + (lane & 7)) * LD + (mi & 1) * 8 + hf * KH * 16;
#pragma unroll
    for (int kk = 0; kk < KH; kk++) {
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
      for (int e = 0; e < 4; e++) {
        s[n][e] = sa[0][n][e] + sa[1][n][e];
        mine[(n * 4 + e) * 32] = s[n][e];
      }
    pair_sync<PAIRS>(pair);
#pragma unroll
    for (int n = 0; n < 2; n++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        float other = theirs[(n * 4 + e) * 32];
        s[n][e] = hf ? other + s[n][e] : s[n][e] + other;  // half 0 first on both warps
      }
    mma_softmax_step(s, m, l, o, j0, k1, scale_log2, lane);
    mma_pv_16keys<T>(o, s, tile + (kb + (lane & 7) + ((lane >> 3) & 1) * 8) * LD +
                               (lane >> 4) * 8 + hf * HALF);
  }
  asm volatile("cp.async.wait_group 0;\n");
  __syncthreads();  // every warp is done with q and the ring: they become the merge buffer
  // both warps of a pair hold the same m and l: half 0 stores them
  mla_merge_key_groups<RANK, HT, KW, THREADS>(sacc, sm_m, sm_l, sm_w, o, m, l, active, hf == 0,
                                              mh * 16 + (lane >> 2), kw, hf * HALF, part_o,
                                              part_ml, b, splits, split, h0, heads, lane, tid);
}

// One kernel per (layout, latent shape), named <NAME>_r<RANK>_<dtype>, with MINB blocks of
// 2 * MH * KW warps an SM at <= 128 registers; the launch parameters are KEYS2_DECODE_CONFIGS
// in atlas_deepseek/cuda/mla_decode_plan.py; must match these (test_mla_decode_plan.py).
#define MLA_KEYS2_ONE(T, S, NAME, RANK, ROPE, MH, KW, MINB)                                    \
  extern "C" __global__ void __launch_bounds__(64 * MH * KW, MINB) NAME##_r##RANK##_##S(      \
      float* po, float* pml, const T* ql, const T* qp, const T* cache, const int* tables,      \
      const int* lens, int heads, int max_blocks, int bs, float scale_log2, int splits,        \
      int stages) {                                                                            \
    mla_decode_keys2_impl<T, RANK, ROPE, MH, KW>(po, pml, ql, qp, cache, tables, lens, heads,  \
                                                 max_blocks, bs, scale_log2, splits, stages);  \
  }
// Mistral-Small-4 (256 + 64), 32 heads: one block of 2 x 4 pairs (64-key tiles) an SM, or two
// blocks of 2 x 2 pairs (32-key tiles).
#define MLA_KEYS2(T, S)                                         \
  MLA_KEYS2_ONE(T, S, mla_decode_keys2, 256, 64, 2, 4, 1)       \
  MLA_KEYS2_ONE(T, S, mla_decode_keys2x2, 256, 64, 2, 2, 2)
INSTANTIATE(MLA_KEYS2)
#endif
