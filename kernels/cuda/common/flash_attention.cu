// Multi-token attention on tensor cores (mma.sync m16n8k16, so sm_80+ incl. GB10): flash-style,
// for prefill and chunked prefill over the paged KV cache or dense K/V.
// Grid (query tiles, query heads): a block takes BM = 64 query rows of one sequence and one
// head (4 warps x 16 rows) and streams the keys in BN = 64 tiles through a two-stage cp.async
// pipeline (block-table gather for paged caches); S = Q K^T and O += P V run on mma.sync with
// an online softmax in registers. Causal (flash_*): tiles past a sequence's last query are
// skipped. Bidirectional (flash_bidir_*, dense K/V of vision towers): every query of a
// sequence sees all of its keys; the CAUSAL template flag leaves the causal kernels' code as is.
#include "common.cuh"
#include "mma.cuh"
#if ATLAS_MMA

constexpr int FA_BM = 64, FA_BN = 64, FA_THREADS = 128;

// Block x -> (sequence, first query row of the tile); false past the last tile.
__device__ __forceinline__ bool fa_tile(const int* cu_q, int num_seqs, int idx, int& b, int& q0) {
  for (b = 0; b < num_seqs; b++) {
    int n = cu_q[b + 1] - cu_q[b], tiles = (n + FA_BM - 1) / FA_BM;
    if (idx < tiles) { q0 = idx * FA_BM; return true; }
    idx -= tiles;
  }
  return false;
}

template <typename T, int D, bool CAUSAL>
__device__ void flash_impl(T* out, const T* q, const T* kb, const T* vb, const int* block_tables,
                           const int* seq_lens, const int* cu_q, int H, int KH, int block_size,
                           int max_blocks, int num_seqs, float scale_log2) {
  constexpr int LD = D + 8, KSTEPS = D / 16, NS = FA_BN / 8, ND = D / 8, CH = D / 8;
  extern __shared__ __align__(16) unsigned char fa_smem[];
  T* sq = reinterpret_cast<T*>(fa_smem);
  T* sk = sq + FA_BM * LD;          // [2][BN][LD]
  T* sv = sk + 2 * FA_BN * LD;      // [2][BN][LD]
  int b, q0;
  // Reversed so the longest (last, most keys) tiles start first.
  if (!fa_tile(cu_q, num_seqs, gridDim.x - 1 - blockIdx.x, b, q0)) return;
  int h = blockIdx.y, kh = h / (H / KH);
  int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  int q_start = cu_q[b], n_q = cu_q[b + 1] - q_start;
  bool paged = block_tables != 0;
  int seq_len = paged ? seq_lens[b] : n_q, ctx = seq_len - n_q;
  int kv_end = CAUSAL ? min(seq_len, ctx + min(q0 + FA_BM, n_q)) : seq_len;
  int num_tiles = (kv_end + FA_BN - 1) / FA_BN;

  for (int c = tid; c < FA_BM * CH; c += FA_THREADS) {
    int r = c / CH, col = (c % CH) * 8;
    bool ok = q0 + r < n_q;
    const T* src = q + ((long long)(q_start + (ok ? q0 + r : 0)) * H + h) * D + col;
    cp_async16(sq + r * LD + col, src, ok);
  }
  auto load_kv = [&](int stage, int j0) {
    T* dk = sk + stage * FA_BN * LD;
    T* dv = sv + stage * FA_BN * LD;
    for (int c = tid; c < FA_BN * CH; c += FA_THREADS) {
      int r = c / CH, col = (c % CH) * 8, j = j0 + r;
      bool ok = j < seq_len;
      long long row = 0;
      if (ok) {
        row = paged ? ((long long)block_tables[(long long)b * max_blocks + j / block_size] *
                           block_size + j % block_size) * KH + kh
                    : (long long)(q_start + j) * KH + kh;
      }
      cp_async16(dk + r * LD + col, kb + row * D + col, ok);
      cp_async16(dv + r * LD + col, vb + row * D + col, ok);
    }
  };
  if (num_tiles > 0) load_kv(0, 0);
  asm volatile("cp.async.commit_group;\n");

  float o[ND][4], m[2] = {NEG_INF, NEG_INF}, l[2] = {0.f, 0.f};
#pragma unroll
  for (int i = 0; i < ND; i++)
#pragma unroll
    for (int e = 0; e < 4; e++) o[i][e] = 0.f;
  u32 qa[KSTEPS][4];
  int row_lo = q0 + warp * 16 + (lane >> 2);       // query row (within the sequence) of c0/c1
  int pos[2] = {ctx + row_lo, ctx + row_lo + 8};   // its position; c2/c3 are 8 rows further

  for (int it = 0; it < num_tiles; it++) {
    if (it + 1 < num_tiles) load_kv((it + 1) & 1, (it + 1) * FA_BN);
    asm volatile("cp.async.commit_group;\n");
    asm volatile("cp.async.wait_group 1;\n");
    __syncthreads();
    if (it == 0) {
#pragma unroll
      for (int kk = 0; kk < KSTEPS; kk++)
        ldmatrix_x4(qa[kk], sq + (warp * 16 + (lane & 15)) * LD + kk * 16 + (lane >> 4) * 8);
    }
    const T* tk = sk + (it & 1) * FA_BN * LD;
    const T* tv = sv + (it & 1) * FA_BN * LD;
    int j0 = it * FA_BN;
    float s[NS][4];
#pragma unroll
    for (int n = 0; n < NS; n++)
#pragma unroll
      for (int e = 0; e < 4; e++) s[n][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < KSTEPS; kk++) {
#pragma unroll
      for (int n = 0; n < NS; n += 2) {
        int mi = lane >> 3;
        u32 t[4];
        ldmatrix_x4(t, tk + (n * 8 + (mi >> 1) * 8 + (lane & 7)) * LD + kk * 16 + (mi & 1) * 8);
        u32 b0[2] = {t[0], t[1]}, b1[2] = {t[2], t[3]};
        mma16816<T>(s[n], qa[kk], b0);
        mma16816<T>(s[n + 1], qa[kk], b1);
      }
    }
    float mx[2] = {m[0], m[1]};
#pragma unroll
    for (int n = 0; n < NS; n++) {
#pragma unroll
      for (int e = 0; e < 4; e++) {
        int j = j0 + n * 8 + (lane & 3) * 2 + (e & 1), r = e >> 1;
        bool seen = CAUSAL ? j <= pos[r] && j < seq_len : j < seq_len;
        float v = seen ? s[n][e] * scale_log2 : NEG_INF;
        s[n][e] = v;
        mx[r] = fmaxf(mx[r], v);
      }
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
#pragma unroll
    for (int i = 0; i < ND; i++) {
      o[i][0] *= corr[0]; o[i][1] *= corr[0]; o[i][2] *= corr[1]; o[i][3] *= corr[1];
    }
#pragma unroll
    for (int n = 0; n < NS; n++) {
#pragma unroll
      for (int e = 0; e < 4; e++) {
        int r = e >> 1;
        float p = m[r] == NEG_INF ? 0.f : exp2f(s[n][e] - m[r]);
        s[n][e] = p;
        l[r] += p;
      }
    }
#pragma unroll
    for (int ks = 0; ks < FA_BN / 16; ks++) {
      u32 pa[4] = {pack2<T>(s[2 * ks][0], s[2 * ks][1]), pack2<T>(s[2 * ks][2], s[2 * ks][3]),
                   pack2<T>(s[2 * ks + 1][0], s[2 * ks + 1][1]),
                   pack2<T>(s[2 * ks + 1][2], s[2 * ks + 1][3])};
#pragma unroll
      for (int i = 0; i < ND; i += 2) {
        u32 t[4];
        ldmatrix_x4_trans(t, tv + (ks * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + i * 8 +
                                 (lane >> 4) * 8);
        u32 b0[2] = {t[0], t[1]}, b1[2] = {t[2], t[3]};
        mma16816<T>(o[i], pa, b0);
        mma16816<T>(o[i + 1], pa, b1);
      }
    }
    __syncthreads();
  }
  asm volatile("cp.async.wait_group 0;\n");

#pragma unroll
  for (int r = 0; r < 2; r++) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
#pragma unroll
  for (int r = 0; r < 2; r++) {
    int row = row_lo + r * 8;
    if (row >= n_q) continue;
    float inv = l[r] > 0.f ? 1.f / l[r] : 0.f;
    T* dst = out + ((long long)(q_start + row) * H + h) * D + (lane & 3) * 2;
#pragma unroll
    for (int i = 0; i < ND; i++)
      *reinterpret_cast<u32*>(dst + i * 8) = pack2<T>(o[i][2 * r] * inv, o[i][2 * r + 1] * inv);
  }
}

#define FLASH_ONE(T, S, D, CAUSAL, NAME)                                                      \
  extern "C" __global__ void __launch_bounds__(FA_THREADS) NAME##_##S##_d##D(                \
      T* out, const T* q, const T* k, const T* v, const int* bt, const int* sl,               \
      const int* cu, int H, int KH, int bs, int mb, int ns, float sc) {                       \
    flash_impl<T, D, CAUSAL>(out, q, k, v, bt, sl, cu, H, KH, bs, mb, ns, sc);                \
  }
#define FLASH_D(T, S, D) FLASH_ONE(T, S, D, true, flash) FLASH_ONE(T, S, D, false, flash_bidir)
#define FLASH(T, S) FLASH_D(T, S, 64) FLASH_D(T, S, 80) FLASH_D(T, S, 128)
INSTANTIATE(FLASH)
#endif
