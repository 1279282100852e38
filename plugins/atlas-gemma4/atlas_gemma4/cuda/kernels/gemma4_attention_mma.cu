// atlas-gemma4: swa_mma, the prefill tile of sliding_window_attention on tensor cores (bf16 /
// f16 builds; the f32 build is empty): mma.sync m16n8k16 with fp32 accumulators. Same
// semantics and arguments as swa_tile (gemma4_attention.cu).
#include "gemma4_attention.cuh"
#if ATLAS_MMA
#include "mma.cuh"

// Shapes of swa_mma: 64 (token, head) rows a block (16 a warp), BN keys a tile, DO output
// columns a block (grid z splits 512-wide heads in two; each half recomputes the scores).
// Shared memory rows are padded by 8 elements so the fragment loads hit 32 distinct banks.
template <int D>
struct SwaMma {
  static constexpr int R = 64;
  static constexpr int BN = D >= 512 ? 16 : 32;
  static constexpr int DO = D > 256 ? 256 : D;
  static constexpr int QS = D + 8;
  static constexpr int VS = BN + 8;
  static constexpr int SMEM = 2 * (R * QS + BN * QS + DO * VS);
};

__device__ __forceinline__ u32 swa_ld2(const void* p) { return *reinterpret_cast<const u32*>(p); }

// The two (token, head) rows a thread holds in the mma fragments (row and row + 8 of the
// block's R): whether each is a token of the sequence, its position and its window's first key.
template <int HB>
__device__ __forceinline__ void swa_mma_rows(int row, int t0, int t_end, int p0, int window,
                                             bool* ok, int* pos, int* first) {
#pragma unroll
  for (int i = 0; i < 2; i++) {
    int tok = (row + 8 * i) / HB;
    ok[i] = t0 + tok < t_end;
    pos[i] = p0 + tok;
    first[i] = swa_first(pos[i], window);
  }
}

// swa_tile on tensor cores (bf16 / f16): S = Q K^T and O += P V with mma.sync m16n8k16, fp32
// accumulators, the online softmax in registers. A thread holds rows g and g + 8 of its warp's
// 16 (g = lane / 4) and, of every 8-column tile, columns 2 (lane % 4) and 2 (lane % 4) + 1.
template <typename T, int D, int HB>
__device__ void swa_mma_impl(T* out, const T* q, const T* kc, const T* vc,
                             const int* block_tables, const int* seq_lens, const int* cu_q,
                             SwaArgs a) {
  using P = SwaMma<D>;
  constexpr int R = P::R, BN = P::BN, DO = P::DO, QS = P::QS, VS = P::VS, BT = R / HB;
  extern __shared__ __align__(16) unsigned char swa_mma_smem[];
  T* sQ = reinterpret_cast<T*>(swa_mma_smem);
  T* sK = sQ + R * QS;
  T* sVt = sK + BN * QS;
  int b, t0;
  if (!swa_tile_of(cu_q, a.num_seqs, blockIdx.x, BT, b, t0)) return;
  int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, tq = lane & 3;
  int H = a.num_heads, KH = a.num_kv_heads, chunks = H / KH / HB, d0 = blockIdx.z * DO;
  int kh = blockIdx.y / chunks, h0 = kh * (H / KH) + (blockIdx.y % chunks) * HB;
  int t_end = cu_q[b + 1], first_pos = seq_lens[b] - (t_end - cu_q[b]);
  int p0 = first_pos + (t0 - cu_q[b]), p1 = first_pos + (min(t0 + BT, t_end) - 1 - cu_q[b]);
  int lo = swa_first(p0, a.window), hi = p1 + 1;
  const int* bt_row = block_tables + (long long)b * a.max_blocks;
  for (int idx = tid; idx < R * D / 8; idx += blockDim.x) {
    int r = idx / (D / 8), e = (idx % (D / 8)) * 8, t = t0 + r / HB;
    Vec8<T> v;
    v.raw = make_uint4(0u, 0u, 0u, 0u);
    if (t < t_end) v.load(q + ((long long)t * H + h0 + r % HB) * D + e);
    v.store(sQ + r * QS + e);
  }
  int row_pos[2], row_first[2];
  bool row_ok[2];
  swa_mma_rows<HB>(warp * 16 + g, t0, t_end, p0, a.window, row_ok, row_pos, row_first);
  float m[2] = {NEG_INF, NEG_INF}, l[2] = {0.f, 0.f};
  float o[DO / 8][4];
#pragma unroll
  for (int n = 0; n < DO / 8; n++)
#pragma unroll
    for (int i = 0; i < 4; i++) o[n][i] = 0.f;
  const T* qw = sQ + (warp * 16 + g) * QS + 2 * tq;
  for (int k0 = lo; k0 < hi; k0 += BN) {
    __syncthreads();
    for (int idx = tid; idx < BN * D / 8; idx += blockDim.x) {
      int c = idx / (D / 8), e = (idx % (D / 8)) * 8, j = k0 + c;
      Vec8<T> kv, vv;
      kv.raw = vv.raw = make_uint4(0u, 0u, 0u, 0u);
      bool in_out = e >= d0 && e < d0 + DO;
      if (j < hi) {
        long long row = swa_row(bt_row, j, a.block_size, KH, kh);
        kv.load(kc + row * D + e);
        if (in_out) vv.load(vc + row * D + e);
      }
      kv.store(sK + c * QS + e);
      if (in_out) {
        const T* ve = reinterpret_cast<const T*>(&vv.raw);
#pragma unroll
        for (int x = 0; x < 8; x++) sVt[(e - d0 + x) * VS + c] = ve[x];
      }
    }
    __syncthreads();
    float s[BN / 8][4];
#pragma unroll
    for (int n = 0; n < BN / 8; n++)
#pragma unroll
      for (int i = 0; i < 4; i++) s[n][i] = 0.f;
#pragma unroll 4
    for (int kk = 0; kk < D / 16; kk++) {
      u32 af[4] = {swa_ld2(qw + kk * 16), swa_ld2(qw + 8 * QS + kk * 16),
                   swa_ld2(qw + kk * 16 + 8), swa_ld2(qw + 8 * QS + kk * 16 + 8)};
#pragma unroll
      for (int n = 0; n < BN / 8; n++) {
        const T* kr = sK + (n * 8 + g) * QS + kk * 16 + 2 * tq;
        u32 bf[2] = {swa_ld2(kr), swa_ld2(kr + 8)};
        mma16816<T>(s[n], af, bf);
      }
    }
    float mx[2] = {NEG_INF, NEG_INF};
#pragma unroll
    for (int n = 0; n < BN / 8; n++)
#pragma unroll
      for (int i = 0; i < 4; i++) {
        int r = i >> 1, j = k0 + n * 8 + 2 * tq + (i & 1);
        bool ok = row_ok[r] && j < hi && j <= row_pos[r] && j >= row_first[r];
        s[n][i] = ok ? s[n][i] * a.scale_log2 : NEG_INF;
        mx[r] = fmaxf(mx[r], s[n][i]);
      }
    float corr[2], sum[2] = {0.f, 0.f};
#pragma unroll
    for (int r = 0; r < 2; r++) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      float mn = fmaxf(m[r], mx[r]);
      corr[r] = mn == NEG_INF ? 1.f : exp2f(m[r] - mn);
      m[r] = mn;
    }
#pragma unroll
    for (int n = 0; n < BN / 8; n++)
#pragma unroll
      for (int i = 0; i < 4; i++) {
        int r = i >> 1;
        s[n][i] = s[n][i] == NEG_INF ? 0.f : exp2f(s[n][i] - m[r]);
        sum[r] += s[n][i];
      }
#pragma unroll
    for (int r = 0; r < 2; r++) {
      sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 1);
      sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 2);
      l[r] = l[r] * corr[r] + sum[r];
    }
#pragma unroll
    for (int n = 0; n < DO / 8; n++) {
      o[n][0] *= corr[0]; o[n][1] *= corr[0];
      o[n][2] *= corr[1]; o[n][3] *= corr[1];
    }
#pragma unroll
    for (int ks = 0; ks < BN / 16; ks++) {
      u32 pf[4] = {pack2<T>(s[2 * ks][0], s[2 * ks][1]), pack2<T>(s[2 * ks][2], s[2 * ks][3]),
                   pack2<T>(s[2 * ks + 1][0], s[2 * ks + 1][1]),
                   pack2<T>(s[2 * ks + 1][2], s[2 * ks + 1][3])};
#pragma unroll
      for (int n = 0; n < DO / 8; n++) {
        const T* vr = sVt + (n * 8 + g) * VS + ks * 16 + 2 * tq;
        u32 bf[2] = {swa_ld2(vr), swa_ld2(vr + 8)};
        mma16816<T>(o[n], pf, bf);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < 2; r++) {
    int row = warp * 16 + g + 8 * r, t = t0 + row / HB;
    if (t >= t_end) continue;
    float f = l[r] > 0.f ? 1.f / l[r] : 0.f;
    T* dst = out + ((long long)t * H + h0 + row % HB) * D + d0 + 2 * tq;
#pragma unroll
    for (int n = 0; n < DO / 8; n++) {
      dst[n * 8] = from_f32<T>(o[n][2 * r] * f);
      dst[n * 8 + 1] = from_f32<T>(o[n][2 * r + 1] * f);
    }
  }
}

// swa_fa: the same tiles as swa_mma (64 (token, head) rows a block, 16 a warp; grid z splits
// 512-wide heads into two column halves), streamed flash-style: K tiles and V's column half of
// BN = 32 keys through a two-stage cp.async ring (block-table gather; no transposed copy, V is
// read by ldmatrix.trans), the query rows staged once and read by ldmatrix. swa_mma copies
// each tile synchronously (16 keys at 512) and transposes V element by element; its 32k-token
// prompts prefilled at 8,025 (gemma-4-26b-a4b) and 2,155 (31b) tok/s on an H200 (session 24).
template <int D>
struct SwaFa {
  static constexpr int R = 64, BN = 32, DO = D > 256 ? 256 : D, QS = D + 8, VS = DO + 8;
  static constexpr int SMEM = 2 * (R * QS + 2 * BN * QS + 2 * BN * VS);
};

template <typename T, int D, int HB>
__device__ void swa_fa_impl(T* out, const T* q, const T* kc, const T* vc, const int* block_tables,
                            const int* seq_lens, const int* cu_q, SwaArgs a) {
  using P = SwaFa<D>;
  constexpr int R = P::R, BN = P::BN, DO = P::DO, QS = P::QS, VS = P::VS, BT = R / HB;
  constexpr int KSTEPS = D / 16, NS = BN / 8, ND = DO / 8, CH = D / 8, CHV = DO / 8;
  extern __shared__ __align__(16) unsigned char swa_fa_smem[];
  T* sQ = reinterpret_cast<T*>(swa_fa_smem);  // [R][QS]
  T* sK = sQ + R * QS;                        // [2][BN][QS]
  T* sV = sK + 2 * BN * QS;                   // [2][BN][VS]: columns d0 .. d0 + DO - 1
  int b, t0;
  if (!swa_tile_of(cu_q, a.num_seqs, blockIdx.x, BT, b, t0)) return;
  int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2;
  int H = a.num_heads, KH = a.num_kv_heads, chunks = H / KH / HB, d0 = blockIdx.z * DO;
  int kh = blockIdx.y / chunks, h0 = kh * (H / KH) + (blockIdx.y % chunks) * HB;
  int t_end = cu_q[b + 1], first_pos = seq_lens[b] - (t_end - cu_q[b]);
  int p0 = first_pos + (t0 - cu_q[b]), p1 = first_pos + (min(t0 + BT, t_end) - 1 - cu_q[b]);
  int lo = swa_first(p0, a.window), hi = p1 + 1, tiles = (hi - lo + BN - 1) / BN;
  const int* bt_row = block_tables + (long long)b * a.max_blocks;
  // row r: token t0 + r / HB, head h0 + r % HB (zeros past the sequence's last token)
  for (int c = tid; c < R * CH; c += 128) {
    int r = c / CH, col = (c % CH) * 8, t = t0 + r / HB;
    bool ok = t < t_end;
    cp_async16(sQ + r * QS + col, q + ((long long)(ok ? t : t0) * H + h0 + r % HB) * D + col, ok);
  }
  // keys lo .. hi - 1 lie in the first row's window, so their blocks are never freed ones
  auto load = [&](int stage, int k0) {
    T* dk = sK + stage * BN * QS;
    T* dv = sV + stage * BN * VS;
    for (int c = tid; c < BN * CH; c += 128) {
      int r = c / CH, col = (c % CH) * 8, j = k0 + r;
      bool ok = j < hi;
      long long row = ok ? swa_row(bt_row, j, a.block_size, KH, kh) : 0;
      cp_async16(dk + r * QS + col, kc + row * D + col, ok);
    }
    for (int c = tid; c < BN * CHV; c += 128) {
      int r = c / CHV, col = (c % CHV) * 8, j = k0 + r;
      bool ok = j < hi;
      long long row = ok ? swa_row(bt_row, j, a.block_size, KH, kh) : 0;
      cp_async16(dv + r * VS + col, vc + row * D + d0 + col, ok);
    }
  };
  if (tiles > 0) load(0, lo);
  asm volatile("cp.async.commit_group;\n");

  int row_pos[2], row_first[2];
  bool row_ok[2];
  swa_mma_rows<HB>(warp * 16 + g, t0, t_end, p0, a.window, row_ok, row_pos, row_first);
  float o[ND][4], m[2] = {NEG_INF, NEG_INF}, l[2] = {0.f, 0.f};
#pragma unroll
  for (int n = 0; n < ND; n++)
#pragma unroll
    for (int e = 0; e < 4; e++) o[n][e] = 0.f;
  const T* qrow = sQ + (warp * 16 + (lane & 15)) * QS + (lane >> 4) * 8;
  for (int it = 0; it < tiles; it++) {
    if (it + 1 < tiles) load((it + 1) & 1, lo + (it + 1) * BN);
    asm volatile("cp.async.commit_group;\n");
    asm volatile("cp.async.wait_group 1;\n");
    __syncthreads();  // tile `it` (and, the first time, the query rows) landed for everyone
    const T* tk = sK + (it & 1) * BN * QS;
    const T* tv = sV + (it & 1) * BN * VS;
    int k0 = lo + it * BN;
    float s[NS][4];
#pragma unroll
    for (int n = 0; n < NS; n++)
#pragma unroll
      for (int e = 0; e < 4; e++) s[n][e] = 0.f;
#pragma unroll 4
    for (int kk = 0; kk < KSTEPS; kk++) {
      u32 qa[4];
      ldmatrix_x4(qa, qrow + kk * 16);
#pragma unroll
      for (int n = 0; n < NS; n += 2) {
        int mi = lane >> 3;
        u32 t4[4];
        ldmatrix_x4(t4, tk + (n * 8 + (mi >> 1) * 8 + (lane & 7)) * QS + kk * 16 + (mi & 1) * 8);
        u32 b0[2] = {t4[0], t4[1]}, b1[2] = {t4[2], t4[3]};
        mma16816<T>(s[n], qa, b0);
        mma16816<T>(s[n + 1], qa, b1);
      }
    }
    float mx[2] = {m[0], m[1]};
#pragma unroll
    for (int n = 0; n < NS; n++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        int r = e >> 1, j = k0 + n * 8 + (lane & 3) * 2 + (e & 1);
        bool ok = row_ok[r] && j < hi && j <= row_pos[r] && j >= row_first[r];
        s[n][e] = ok ? s[n][e] * a.scale_log2 : NEG_INF;
        mx[r] = fmaxf(mx[r], s[n][e]);
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
    for (int n = 0; n < ND; n++) {
      o[n][0] *= corr[0]; o[n][1] *= corr[0]; o[n][2] *= corr[1]; o[n][3] *= corr[1];
    }
#pragma unroll
    for (int n = 0; n < NS; n++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        int r = e >> 1;
        float p = m[r] == NEG_INF ? 0.f : exp2f(s[n][e] - m[r]);
        s[n][e] = p;
        l[r] += p;
      }
#pragma unroll
    for (int ks = 0; ks < BN / 16; ks++) {
      u32 pa[4] = {pack2<T>(s[2 * ks][0], s[2 * ks][1]), pack2<T>(s[2 * ks][2], s[2 * ks][3]),
                   pack2<T>(s[2 * ks + 1][0], s[2 * ks + 1][1]),
                   pack2<T>(s[2 * ks + 1][2], s[2 * ks + 1][3])};
#pragma unroll
      for (int n = 0; n < ND; n += 2) {
        u32 t4[4];
        ldmatrix_x4_trans(t4, tv + (ks * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * VS + n * 8 +
                                  (lane >> 4) * 8);
        u32 b0[2] = {t4[0], t4[1]}, b1[2] = {t4[2], t4[3]};
        mma16816<T>(o[n], pa, b0);
        mma16816<T>(o[n + 1], pa, b1);
      }
    }
    __syncthreads();  // everyone is done with this stage before the next load overwrites it
  }
  asm volatile("cp.async.wait_group 0;\n");
#pragma unroll
  for (int r = 0; r < 2; r++) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    int row = warp * 16 + g + 8 * r, t = t0 + row / HB;
    if (!row_ok[r]) continue;
    float f = l[r] > 0.f ? 1.f / l[r] : 0.f;
    T* dst = out + ((long long)t * H + h0 + row % HB) * D + d0 + (lane & 3) * 2;
#pragma unroll
    for (int n = 0; n < ND; n++)
      *reinterpret_cast<u32*>(dst + n * 8) = pack2<T>(o[n][2 * r] * f, o[n][2 * r + 1] * f);
  }
}

#define SWA_MMA(T, S, D, HB)                                                                  \
  extern "C" __global__ void __launch_bounds__(128) swa_mma_##S##_d##D##_h##HB(              \
      T* out, const T* q, const T* k, const T* v, const int* bt, const int* sl,               \
      const int* cu, int H, int KH, int bs, int mb, int ns, int nsp, int win, float sc) {      \
    SWA_ARGS;                                                                                 \
    swa_mma_impl<T, D, HB>(out, q, k, v, bt, sl, cu, a);                                      \
  }
#define SWA_MMA_D(T, S, D)                                                                    \
  SWA_MMA(T, S, D, 1) SWA_MMA(T, S, D, 2) SWA_MMA(T, S, D, 4) SWA_MMA(T, S, D, 8)             \
  SWA_MMA(T, S, D, 16)
#define SWA_FA(T, S, D, HB)                                                                   \
  extern "C" __global__ void __launch_bounds__(128) swa_fa_##S##_d##D##_h##HB(               \
      T* out, const T* q, const T* k, const T* v, const int* bt, const int* sl,               \
      const int* cu, int H, int KH, int bs, int mb, int ns, int nsp, int win, float sc) {      \
    SWA_ARGS;                                                                                 \
    swa_fa_impl<T, D, HB>(out, q, k, v, bt, sl, cu, a);                                       \
  }
#define SWA_FA_D(T, S, D)                                                                     \
  SWA_FA(T, S, D, 1) SWA_FA(T, S, D, 2) SWA_FA(T, S, D, 4) SWA_FA(T, S, D, 8) SWA_FA(T, S, D, 16)
#define SWA_MMA_ALL(T, S)                                                                     \
  SWA_MMA_D(T, S, 64) SWA_MMA_D(T, S, 128) SWA_MMA_D(T, S, 256) SWA_MMA_D(T, S, 512)          \
  SWA_FA_D(T, S, 64) SWA_FA_D(T, S, 128) SWA_FA_D(T, S, 256) SWA_FA_D(T, S, 512)

INSTANTIATE(SWA_MMA_ALL)
#endif
