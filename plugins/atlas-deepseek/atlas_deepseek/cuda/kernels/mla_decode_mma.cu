// atlas-deepseek: absorbed MLA decode attention on tensor cores (mma.sync m16n8k16, sm_80+),
// the fast path of mla_absorbed_attention for decode steps (one query per sequence); the
// partials are merged by mla_decode_combine (mla_attention.cu), as for the SIMT split kernel.
//
// Why tensor cores: every head of a token reads the same latent row per key (MQA over the
// latent), so a block stages a tile of BN keys' rows (RANK + ROPE values each) in shared memory
// once and runs S = Q_abs . C^T and O += P . C[:, :RANK] for a tile of HT = 16 * MW heads as
// matrix products. DeepSeek-V3 (128 heads, 512 + 64) does ~240 FLOP per latent byte, so it is
// bound by the math: reading the latent at 70% of HBM speed (~3 TB/s on an H200) would take
// ~720 TFLOP/s of mma.sync, past what m16n8k16 issue sustains on Hopper (well under the
// ~990 TFLOP/s wgmma peak), so its floor is the tensor cores, not the latent read; this kernel
// stays its path. Mistral-Small-4 (32 heads, 256 + 64) is bound by the latent read and takes
// mla_decode_keys.cu unless ATLAS_MLA_DECODE=v1. Tiles stream through a cp.async pipeline of
// `stages` buffers (2..4, what shared memory holds) that keeps the next tiles' loads in flight
// while one is computed.
//
// Grid (sequence, head group of HT heads, context split). Warp (mw, nw) of MW x NW:
//   S: the partial product of heads mw*16.. over the nw-th slice of the row width (W / NW
//      columns: its k-steps), for all BN keys of the tile; the NW partials meet in shared
//      memory and every warp of the row group sums them in the same order (so all NW warps of
//      a head hold bit-identical scores, maxima and sums);
//   softmax: online, per head, in the exp2 domain (scores pre-scaled by scale * log2 e);
//   O: heads mw*16.. times latent columns nw*RANK/NW.. (P from registers, C by ldmatrix.trans).
// Keys past the split's end are zero-filled by cp.async and masked to -inf; heads past `heads`
// are zero queries whose rows are never written. A split with no keys writes max -inf, sum 0.
// Writes unnormalised partials (acc, max in the natural-log domain, sum) per split.
#include "common.cuh"
#include "mma.cuh"
#if ATLAS_MMA
#include "mla_decode_tile.cuh"

template <typename T, int RANK, int ROPE, int MW, int NW, int BN>
__device__ void mla_decode_mma_impl(float* part_o, float* part_ml, const T* q_lat,
                                    const T* q_pe, const T* cache, const int* tables,
                                    const int* seq_lens, int heads, int max_blocks,
                                    int block_size, float scale_log2, int splits, int stages) {
  constexpr int W = RANK + ROPE, LD = W + 8;          // row width; padded smem row (no conflicts)
  constexpr int HT = 16 * MW, THREADS = 32 * MW * NW;
  constexpr int KSW = W / 16 / NW;                   // k-steps of S per warp
  constexpr int CW = RANK / NW, ND = CW / 8;         // O columns per warp; their n8 tiles
  constexpr int NS = BN / 8, LDS = BN + 8;           // n8 key tiles of S; partial-S row stride
  constexpr int CH = W / 8;                          // 16-byte chunks per row
  constexpr bool QREG = KSW <= 10;                   // the warp's query slice fits registers
  static_assert(RANK % 8 == 0 && ROPE % 8 == 0 && (W / 16) % NW == 0 && W % 16 == 0,
                "row width: whole k-steps per warp");
  static_assert(CW % 16 == 0 && BN % 16 == 0, "O columns and keys in pairs of n8 tiles");
  extern __shared__ __align__(16) unsigned char mla_mma_smem[];
  T* sq = reinterpret_cast<T*>(mla_mma_smem);                      // [HT][LD]
  T* skv = sq + HT * LD;                                           // [stages][BN][LD]
  float* sp = reinterpret_cast<float*>(skv + stages * BN * LD);    // [NW][HT][LDS]

  int b = blockIdx.x, h0 = blockIdx.y * HT, split = blockIdx.z;
  int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, mw = warp % MW, nw = warp / MW;
  int k0, k1, ntiles;
  mla_split_keys<BN>(seq_lens[b], splits, split, k0, k1, ntiles);
  const int* table = tables + (long long)b * max_blocks;
  mla_load_queries<T, RANK, ROPE, HT, THREADS>(sq, q_lat, q_pe, b, h0, heads, tid);
  auto load_tile = [&](int stage, int t0) {
    T* dst = skv + stage * BN * LD;
    for (int c = tid; c < BN * CH; c += THREADS) {
      int r = c / CH, col = (c % CH) * 8, j = t0 + r;
      bool ok = j < k1;
      long long row = ok ? (long long)table[j / block_size] * block_size + j % block_size : 0;
      cp_async16(dst + r * LD + col, cache + row * W + col, ok);
    }
  };
  auto load = [&](int buf, int tile) { load_tile(buf, k0 + tile * BN); };
  mla_ring_prime(stages, ntiles, load);

  float o[ND][4], m[2] = {NEG_INF, NEG_INF}, l[2] = {0.f, 0.f};
#pragma unroll
  for (int i = 0; i < ND; i++)
#pragma unroll
    for (int e = 0; e < 4; e++) o[i][e] = 0.f;
  u32 qa[QREG ? KSW : 1][4];
  const T* qrow = sq + (mw * 16 + (lane & 15)) * LD + nw * KSW * 16 + (lane >> 4) * 8;
  const int prow = mw * 16 + (lane >> 2), pcol = (lane & 3) * 2;  // C-fragment row / column

  for (int it = 0; it < ntiles; it++) {
    mla_wait_ring(stages);
    __syncthreads();  // every copy visible; every warp done with tile it - 1 and its partials
    mla_ring_next(it, stages, ntiles, load);  // into tile it - 1's buffer
    if constexpr (QREG) {
      if (it == 0) {
#pragma unroll
        for (int kk = 0; kk < KSW; kk++) ldmatrix_x4(qa[kk], qrow + kk * 16);
      }
    }
    const T* tile = skv + (it % stages) * BN * LD;

    float s[NS][4];
#pragma unroll
    for (int n = 0; n < NS; n++)
#pragma unroll
      for (int e = 0; e < 4; e++) s[n][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < KSW; kk++) {
      u32 a[4];
      if constexpr (QREG) {
#pragma unroll
        for (int e = 0; e < 4; e++) a[e] = qa[kk][e];
      } else {
        ldmatrix_x4(a, qrow + kk * 16);
      }
      int kc = (nw * KSW + kk) * 16, mi = lane >> 3;
#pragma unroll
      for (int n = 0; n < NS; n += 2) {
        u32 t[4];
        ldmatrix_x4(t, tile + (n * 8 + (mi >> 1) * 8 + (lane & 7)) * LD + kc + (mi & 1) * 8);
        u32 b0[2] = {t[0], t[1]}, b1[2] = {t[2], t[3]};
        mma16816<T>(s[n], a, b0);
        mma16816<T>(s[n + 1], a, b1);
      }
    }
    // Partial scores of this warp's width slice -> shared; sum all NW slices in order.
    float* mine = sp + (nw * HT + prow) * LDS + pcol;
#pragma unroll
    for (int n = 0; n < NS; n++)
#pragma unroll
      for (int r = 0; r < 2; r++) {
        float2 v;
        v.x = s[n][2 * r];
        v.y = s[n][2 * r + 1];
        *reinterpret_cast<float2*>(mine + r * 8 * LDS + n * 8) = v;
      }
    __syncthreads();
#pragma unroll
    for (int n = 0; n < NS; n++)
#pragma unroll
      for (int r = 0; r < 2; r++) {
        float x = 0.f, y = 0.f;
#pragma unroll
        for (int w = 0; w < NW; w++) {
          float2 v = *reinterpret_cast<const float2*>(sp + (w * HT + prow + r * 8) * LDS +
                                                      n * 8 + pcol);
          x += v.x;
          y += v.y;
        }
        s[n][2 * r] = x;
        s[n][2 * r + 1] = y;
      }

    mma_softmax_step(s, m, l, o, k0 + it * BN, k1, scale_log2, lane);

    const T* vcol = tile + nw * CW + (lane >> 4) * 8;
#pragma unroll
    for (int ks = 0; ks < BN / 16; ks++) {
      u32 pa[4] = {pack2<T>(s[2 * ks][0], s[2 * ks][1]), pack2<T>(s[2 * ks][2], s[2 * ks][3]),
                   pack2<T>(s[2 * ks + 1][0], s[2 * ks + 1][1]),
                   pack2<T>(s[2 * ks + 1][2], s[2 * ks + 1][3])};
      const T* vrow = vcol + (ks * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD;
#pragma unroll
      for (int i = 0; i < ND; i += 2) {
        u32 t[4];
        ldmatrix_x4_trans(t, vrow + i * 8);
        u32 b0[2] = {t[0], t[1]}, b1[2] = {t[2], t[3]};
        mma16816<T>(o[i], pa, b0);
        mma16816<T>(o[i + 1], pa, b1);
      }
    }
  }
  asm volatile("cp.async.wait_group 0;\n");

#pragma unroll
  for (int r = 0; r < 2; r++) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
  long long base = ((long long)b * splits + split) * heads;
#pragma unroll
  for (int r = 0; r < 2; r++) {
    int h = h0 + prow + r * 8;
    if (h >= heads) continue;
    float* dst = part_o + (base + h) * RANK + nw * CW + pcol;
#pragma unroll
    for (int i = 0; i < ND; i++) {
      float2 v;
      v.x = o[i][2 * r];
      v.y = o[i][2 * r + 1];
      *reinterpret_cast<float2*>(dst + i * 8) = v;
    }
    if (nw == 0 && (lane & 3) == 0) {
      part_ml[2 * (base + h)] = m[r] * 0.6931471805599453f;  // log2 -> natural (-inf stays)
      part_ml[2 * (base + h) + 1] = l[r];
    }
  }
}

// One kernel per latent shape, named mla_decode_mma_r<RANK>_<dtype>; the launch parameters
// (heads per block 16 * MW, NW * MW warps, BN keys a tile) are MMA_DECODE_CONFIGS in
// atlas_deepseek/cuda/mla_decode_plan.py and must match these (test_mla_decode_plan.py).
#define MLA_MMA_ONE(T, S, RANK, ROPE, MW, NW, BN)                                              \
  extern "C" __global__ void __launch_bounds__(32 * MW * NW, 1) mla_decode_mma_r##RANK##_##S( \
      float* po, float* pml, const T* ql, const T* qp, const T* cache, const int* tables,      \
      const int* lens, int heads, int max_blocks, int bs, float scale_log2, int splits,        \
      int stages) {                                                                            \
    mla_decode_mma_impl<T, RANK, ROPE, MW, NW, BN>(po, pml, ql, qp, cache, tables, lens,       \
                                                   heads, max_blocks, bs, scale_log2, splits,  \
                                                   stages);                                    \
  }
// DeepSeek-V3 / Kimi-K2 (512 + 64): 64 heads, 8 warps, 32-key tiles. Mistral-Small-4
// (256 + 64): 32 heads, 8 warps, 64-key tiles.
#define MLA_MMA(T, S) MLA_MMA_ONE(T, S, 512, 64, 4, 2, 32) MLA_MMA_ONE(T, S, 256, 64, 2, 4, 64)
INSTANTIATE(MLA_MMA)
#endif
