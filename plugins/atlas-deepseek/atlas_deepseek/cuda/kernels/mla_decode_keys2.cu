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
  constexpr int KH = W / 32, CH = W / 8;  // score k-steps of a half row; 16 B chunks of a row
  constexpr int HALF = RANK / 2, ND = HALF / 8;  // a warp's output columns and their n8 tiles
  constexpr int MLD = RANK + 8;  // merge row stride in floats: conflict-free float2 stores
  static_assert(W % 32 == 0 && HALF % 16 == 0, "whole k-steps per half row, n8 pairs of O");
  static_assert(PAIRS <= 8, "one named barrier per pair (pair_sync has 8)");
  extern __shared__ __align__(16) unsigned char mla_keys2_smem[];
  T* sq = reinterpret_cast<T*>(mla_keys2_smem);             // [HT][LD]
  T* skv = sq + HT * LD;                                    // [stages][BN][LD]
  float* sx = reinterpret_cast<float*>(skv + stages * BN * LD);  // [PAIRS][2][8][32]
  float* sacc = reinterpret_cast<float*>(mla_keys2_smem);   // after the loop: [KW][HT][MLD]
  __shared__ float sm_m[KW][HT], sm_l[KW][HT], sm_w[KW][HT];

  int b = blockIdx.x, h0 = blockIdx.y * HT, split = blockIdx.z;
  int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  int hf = warp & 1, pair = warp >> 1, mh = pair % MH, kw = pair / MH;
  int len = seq_lens[b];
  int chunk = ((len + splits - 1) / splits + BN - 1) / BN * BN;
  int k0 = min(len, split * chunk), k1 = min(len, k0 + chunk);
  int ntiles = (k1 - k0 + BN - 1) / BN;
  const int* table = tables + (long long)b * max_blocks;
  // Power-of-two pages (16, 64: all in practice) gather by shifts, not divisions.
  int bshift = (block_size & (block_size - 1)) == 0 ? __ffs(block_size) - 1 : -1;

  for (int c = tid; c < HT * CH; c += THREADS) {
    int r = c / CH, col = (c % CH) * 8, h = h0 + r;
    bool ok = h < heads;
    long long row = (long long)b * heads + (ok ? h : 0);
    const T* src = col < RANK ? q_lat + row * RANK + col : q_pe + row * ROPE + (col - RANK);
    cp_async16(sq + r * LD + col, src, ok);
  }
  auto load_tile = [&](int stage, int t0) {
    T* dst = skv + stage * BN * LD;
    for (int c = tid; c < BN * CH; c += THREADS) {
      int r = c / CH, col = (c % CH) * 8, j = t0 + r;
      bool ok = j < k1;
      int blk = bshift >= 0 ? j >> bshift : j / block_size;
      int off = bshift >= 0 ? j & (block_size - 1) : j % block_size;
      long long row = ok ? (long long)__ldg(table + blk) * block_size + off : 0;
      cp_async16(dst + r * LD + col, cache + row * W + col, ok);
    }
  };
  // Group g holds tile g (group 0 also the queries).
  for (int s = 0; s < stages - 1; s++) {
    if (s < ntiles) load_tile(s, k0 + s * BN);
    asm volatile("cp.async.commit_group;\n");
  }

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
    // Tile `it` landed: stages - 1 + it groups committed, stages - 2 may stay in flight.
    if (stages >= 4) asm volatile("cp.async.wait_group 2;\n");
    else if (stages == 3) asm volatile("cp.async.wait_group 1;\n");
    else asm volatile("cp.async.wait_group 0;\n");
    __syncthreads();  // copies visible; tile it - 1's buffer and exchange partials all read
    int nx = it + stages - 1;
    if (nx < ntiles) load_tile(nx % stages, k0 + nx * BN);
    asm volatile("cp.async.commit_group;\n");
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
    float s[2][4], mx[2] = {m[0], m[1]};
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
        float lo = hf ? other : s[n][e], hi = hf ? s[n][e] : other;  // half 0 first on both
        int j = j0 + n * 8 + (lane & 3) * 2 + (e & 1);
        float v = j < k1 ? (lo + hi) * scale_log2 : NEG_INF;
        s[n][e] = v;
        mx[e >> 1] = fmaxf(mx[e >> 1], v);
      }
    float corr[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      corr[r] = mx[r] == NEG_INF ? 1.f : exp2f(m[r] - mx[r]);
      m[r] = mx[r];
      l[r] *= corr[r];
    }
    // Once the running max settles (most tiles of a long context) skip the 64-float rescale.
    if (__any_sync(0xffffffffu, corr[0] != 1.f || corr[1] != 1.f)) {
#pragma unroll
      for (int n = 0; n < ND; n++) {
        o[n][0] *= corr[0]; o[n][1] *= corr[0]; o[n][2] *= corr[1]; o[n][3] *= corr[1];
      }
    }
#pragma unroll
    for (int n = 0; n < 2; n++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        float p = m[e >> 1] == NEG_INF ? 0.f : exp2f(s[n][e] - m[e >> 1]);
        s[n][e] = p;
        l[e >> 1] += p;
      }
    u32 pa[4] = {pack2<T>(s[0][0], s[0][1]), pack2<T>(s[0][2], s[0][3]),
                 pack2<T>(s[1][0], s[1][1]), pack2<T>(s[1][2], s[1][3])};
    const T* vrow =
        tile + (kb + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + (lane >> 4) * 8 + hf * HALF;
#pragma unroll
    for (int n = 0; n < ND; n += 2) {
      u32 vf[4];
      ldmatrix_x4_trans(vf, vrow + n * 8);
      u32 b0[2] = {vf[0], vf[1]}, b1[2] = {vf[2], vf[3]};
      mma16816<T>(o[n], pa, b0);
      mma16816<T>(o[n + 1], pa, b1);
    }
  }
  asm volatile("cp.async.wait_group 0;\n");
  __syncthreads();  // every warp is done with q and the ring: they become the merge buffer

#pragma unroll
  for (int r = 0; r < 2; r++) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
  if (active) {
    int row = mh * 16 + (lane >> 2);
    float* dst = sacc + (kw * HT + row) * MLD + hf * HALF + (lane & 3) * 2;
#pragma unroll
    for (int r = 0; r < 2; r++)
#pragma unroll
      for (int n = 0; n < ND; n++)
        *reinterpret_cast<float2*>(dst + r * 8 * MLD + n * 8) =
            make_float2(o[n][2 * r], o[n][2 * r + 1]);
    if (hf == 0 && (lane & 3) == 0) {  // both halves hold the same m and l
#pragma unroll
      for (int r = 0; r < 2; r++) {
        sm_m[kw][row + 8 * r] = m[r];
        sm_l[kw][row + 8 * r] = l[r];
      }
    }
  }
  __syncthreads();
  long long base = ((long long)b * splits + split) * heads + h0;  // row of head h0
  if (tid < HT && h0 + tid < heads) {
    float mt = NEG_INF, lt = 0.f;
#pragma unroll
    for (int k = 0; k < KW; k++) mt = fmaxf(mt, sm_m[k][tid]);
#pragma unroll
    for (int k = 0; k < KW; k++) {
      float w = sm_m[k][tid] == NEG_INF ? 0.f : exp2f(sm_m[k][tid] - mt);
      sm_w[k][tid] = w;
      lt += w * sm_l[k][tid];
    }
    part_ml[2 * (base + tid)] = mt * 0.6931471805599453f;  // log2 -> natural (-inf stays)
    part_ml[2 * (base + tid) + 1] = lt;
  }
  __syncthreads();
  for (int i = tid; i < HT * (RANK / 4); i += THREADS) {
    int r = i / (RANK / 4), c = (i % (RANK / 4)) * 4;
    if (h0 + r >= heads) break;  // rows only grow with i
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int k = 0; k < KW; k++) {
      float w = sm_w[k][r];
      float4 v = *reinterpret_cast<const float4*>(sacc + (k * HT + r) * MLD + c);
      acc.x += w * v.x; acc.y += w * v.y; acc.z += w * v.z; acc.w += w * v.w;
    }
    *reinterpret_cast<float4*>(part_o + (base + r) * RANK + c) = acc;
  }
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
