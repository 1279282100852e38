// Split decode attention on tensor cores (mma.sync m16n8k16, sm_80+): the long-context decode
// kernel. Same grid, split plan, partials and in-kernel combine as attn_dec
// (attention_decode.cuh): block (query token t, kv head x head chunk, split) scores one span of
// t's keys for HB query heads sharing one KV head. Why: the CUDA-core kernel spends ~76 warp
// instructions a key (per KV head, four query heads: lane-group dots, shuffle trees) and tops
// out near 1.9 TB/s of K/V at 32k tokens on an H200; here the HB heads are the 16 rows of an
// mma A tile (HB <= 16, the rest zero), so a 16-key slice costs D/16 x 2 + D/8 mma per warp.
// K/V tiles of BN = 64 keys stream through a cp.async ring of NST stages (block-table gather);
// each warp takes 16 keys of every tile with its own online softmax, and the four warps'
// partials merge in shared memory (attn_group_write), then across splits as attn_dec does.
#include "attention_decode.cuh"
#include "mma.cuh"
#if ATLAS_MMA

constexpr int DM_BN = 64, DM_THREADS = 128;

// Stages of the K/V ring a head dim takes (dynamic shared memory, bytes: ops_attention.py's
// mma_decode_smem keeps in step): 4 at 64, 3 at 128 (two blocks an SM), 2 at 256 (one).
template <int D> struct DecMma { static constexpr int NST = D <= 64 ? 4 : D <= 128 ? 3 : 2; };

// MERGE: the last split block merges the partials (dec_combine); false leaves them to
// attn_dec_merge_impl (attention_decode_mma512.cuh), a kernel of its own (decode_merge=kernel).
template <typename T, int D, int HB, bool MERGE = true>
__device__ void attn_dec_mma_impl(T* out, float* part_acc, float* part_ml, int* counters,
                                  const T* q, const T* kb, const T* vb, const int* block_tables,
                                  const int* seq_lens, const int* cu_q, AttnArgs a) {
  constexpr int LD = D + 8, KSTEPS = D / 16, ND = D / 8, CH = D / 8, NST = DecMma<D>::NST;
  static_assert(HB <= 16 && D % 16 == 0, "16 query rows a tile");
  extern __shared__ __align__(16) unsigned char dm_smem[];
  T* sq = reinterpret_cast<T*>(dm_smem);  // [16][LD]
  T* ring = sq + 16 * LD;                 // [NST][K, V][BN][LD]
  __shared__ float sm_m[4][HB], sm_l[4][HB];
  pdl_trigger();
  pdl_wait();  // launched with PDL after rope, which writes the newest key: wait first
  int t = blockIdx.x, split = blockIdx.z;
  int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  int H = a.num_heads, KH = a.num_kv_heads, G = H / KH, chunks = G / HB;
  int kh = blockIdx.y / chunks, h0 = kh * G + (blockIdx.y % chunks) * HB;
  int b = find_seq(cu_q, a.num_seqs, t);
  int n_q = cu_q[b + 1] - cu_q[b], i = t - cu_q[b];
  const int* bt_row = block_tables + (long long)b * a.max_blocks;
  int len = seq_lens[b] - n_q + i + 1;
  // keys lo .. len - 1: all of them, or the last `window` (sliding-window layers; the blocks
  // before lo are never read, so a window pool may have freed them)
  int lo = a.window > 0 ? max(0, len - a.window) : 0, span = len - lo;
  int chunk = (max(span, 1) + a.num_splits - 1) / a.num_splits;
  chunk = (chunk + DM_BN - 1) / DM_BN * DM_BN;
  int n_act = max(1, (span + chunk - 1) / chunk);
  if (split >= n_act) return;
  int start = lo + split * chunk, end = min(start + chunk, len);
  int rounds = (end - start + DM_BN - 1) / DM_BN;

  // q rows h0 .. h0 + HB - 1 of token t (zeros below), in the first copy group
  for (int c = tid; c < 16 * CH; c += DM_THREADS) {
    int r = c / CH, col = (c % CH) * 8;
    bool ok = r < HB;
    cp_async16(sq + r * LD + col, q + ((long long)t * H + h0 + (ok ? r : 0)) * D + col, ok);
  }
  auto issue = [&](int round) {
    T* dk = ring + (round % NST) * 2 * DM_BN * LD;
    T* dv = dk + DM_BN * LD;
    int j0 = start + round * DM_BN;
#pragma unroll
    for (int s = 0; s < DM_BN * CH / DM_THREADS; s++) {
      int c = tid + s * DM_THREADS, r = c / CH, col = (c % CH) * 8, j = j0 + r;
      bool ok = j < end;
      // block-table gather; 16-token blocks (the default) by shifts, not a division
      int blk = a.block_size == 16 ? j >> 4 : j / a.block_size;
      int off = a.block_size == 16 ? j & 15 : j % a.block_size;
      long long row = ok ? ((long long)__ldg(bt_row + blk) * a.block_size + off) * KH + kh : 0;
      cp_async16(dk + r * LD + col, kb + row * D + col, ok);
      cp_async16(dv + r * LD + col, vb + row * D + col, ok);
    }
  };
#pragma unroll
  for (int s = 0; s < NST - 1; s++) {
    if (s < rounds) issue(s);
    asm volatile("cp.async.commit_group;\n");
  }

  float o[ND][4], m[2] = {NEG_INF, NEG_INF}, l[2] = {0.f, 0.f};
#pragma unroll
  for (int n = 0; n < ND; n++)
#pragma unroll
    for (int e = 0; e < 4; e++) o[n][e] = 0.f;
  float scale = a.scale_log2 * a.kv_scale;
  int kbase = warp * 16;  // this warp's 16 keys of every tile
  for (int it = 0; it < rounds; it++) {
    if constexpr (NST >= 4) asm volatile("cp.async.wait_group 2;\n");
    else if constexpr (NST == 3) asm volatile("cp.async.wait_group 1;\n");
    else asm volatile("cp.async.wait_group 0;\n");
    __syncthreads();  // tile `it` landed for everyone; the slot of tile it - 1 is free
    if (it + NST - 1 < rounds) issue(it + NST - 1);
    asm volatile("cp.async.commit_group;\n");
    const T* tk = ring + (it % NST) * 2 * DM_BN * LD;
    const T* tv = tk + DM_BN * LD;
    float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
    for (int kk = 0; kk < KSTEPS; kk++) {
      u32 qa[4], kf[4];
      ldmatrix_x4(qa, sq + (lane & 15) * LD + kk * 16 + (lane >> 4) * 8);
      int mi = lane >> 3;
      ldmatrix_x4(kf, tk + (kbase + (mi >> 1) * 8 + (lane & 7)) * LD + kk * 16 + (mi & 1) * 8);
      u32 b0[2] = {kf[0], kf[1]}, b1[2] = {kf[2], kf[3]};
      mma16816<T>(s[0], qa, b0);
      mma16816<T>(s[1], qa, b1);
    }
    int j0 = start + it * DM_BN + kbase;
    float mx[2] = {m[0], m[1]};
#pragma unroll
    for (int n = 0; n < 2; n++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        int j = j0 + n * 8 + (lane & 3) * 2 + (e & 1);
        float v = j < end ? s[n][e] * scale : NEG_INF;
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
    // once the running max settles (most tiles of a long context), skip the rescale
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
        int r = e >> 1;
        float p = m[r] == NEG_INF ? 0.f : exp2f(s[n][e] - m[r]);
        s[n][e] = p;
        l[r] += p;
      }
    u32 pa[4] = {pack2<T>(s[0][0], s[0][1]), pack2<T>(s[0][2], s[0][3]),
                 pack2<T>(s[1][0], s[1][1]), pack2<T>(s[1][2], s[1][3])};
#pragma unroll
    for (int n = 0; n < ND; n += 2) {
      u32 vf[4];
      ldmatrix_x4_trans(vf, tv + (kbase + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + n * 8 +
                                (lane >> 4) * 8);
      u32 b0[2] = {vf[0], vf[1]}, b1[2] = {vf[2], vf[3]};
      mma16816<T>(o[n], pa, b0);
      mma16816<T>(o[n + 1], pa, b1);
    }
  }
  asm volatile("cp.async.wait_group 0;\n");
  __syncthreads();  // every warp is done with the ring: it now holds the warps' partials

#pragma unroll
  for (int r = 0; r < 2; r++) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
  auto& sm_acc = *reinterpret_cast<float(*)[4][HB][D]>(ring);
#pragma unroll
  for (int r = 0; r < 2; r++) {
    int row = (lane >> 2) + 8 * r;
    if (row >= HB) continue;
#pragma unroll
    for (int n = 0; n < ND; n++) {
      sm_acc[warp][row][n * 8 + (lane & 3) * 2] = o[n][2 * r];
      sm_acc[warp][row][n * 8 + (lane & 3) * 2 + 1] = o[n][2 * r + 1];
    }
    if ((lane & 3) == 0) { sm_m[warp][row] = m[r]; sm_l[warp][row] = l[r]; }
  }
  __syncthreads();
  long long th0 = (long long)t * H + h0;
  attn_group_write<T, 4, HB, D>(out, part_acc, part_ml, sm_acc, sm_m, sm_l, th0, split,
                                a.num_splits, n_act == 1, a.kv_scale);
  if constexpr (!MERGE) return;
  if (n_act == 1 || !dec_last_split(counters, t, n_act)) return;
  dec_combine<T, D, HB>(out, part_acc, part_ml, th0, a.num_splits, n_act, a.kv_scale);
}

#include "attention_decode_mma512.cuh"

// attn_dec_mma_<dtype>_d<D>_h<HB>: the arguments of attn_dec_* (paged K/V in the activation
// dtype only), then the window (0: the whole causal context; else each query's last `win` keys,
// the sliding-window layers of attn_dec_swa_*).
#define DECM_ONE(T, S, D, HB)                                                                 \
  extern "C" __global__ void __launch_bounds__(DM_THREADS) attn_dec_mma_##S##_d##D##_h##HB( \
      T* out, float* pa, float* pm, int* cnt, const T* q, const T* k, const T* v,             \
      const int* bt, const int* sl, const int* cu, int H, int KH, int bs, int mb, int ns,     \
      int nsp, float sc, float kvs, int win) {                                                \
    AttnArgs a{H, KH, bs, mb, ns, nsp, sc, kvs, win};                                          \
    attn_dec_mma_impl<T, D, HB>(out, pa, pm, cnt, q, k, v, bt, sl, cu, a);                    \
  }                                                                                           \
  extern "C" __global__ void __launch_bounds__(DM_THREADS)                                    \
      attn_dec_mma_##S##_d##D##_h##HB##_x(                                                    \
          T* out, float* pa, float* pm, int* cnt, const T* q, const T* k, const T* v,         \
          const int* bt, const int* sl, const int* cu, int H, int KH, int bs, int mb, int ns, \
          int nsp, float sc, float kvs, int win) {                                            \
    AttnArgs a{H, KH, bs, mb, ns, nsp, sc, kvs, win};                                          \
    attn_dec_mma_impl<T, D, HB, false>(out, pa, pm, cnt, q, k, v, bt, sl, cu, a);             \
  }
#define DECM_D(T, S, D) DECM_ONE(T, S, D, 2) DECM_ONE(T, S, D, 4) DECM_ONE(T, S, D, 8)        \
  DECM_ONE(T, S, D, 16)
// GQA groups that are not a power of two (MiniMax-M2 48 / 8, Qwen3-14B 40 / 8, Qwen2.5-7B
// 28 / 4: head dim 128): the whole group in one tile, its rows past HB zero, so the cache is
// read once a KV head (the CUDA-core kernels take 2 or 1 heads a block there)
#define DECM_ODD(T, S) DECM_ONE(T, S, 128, 3) DECM_ONE(T, S, 128, 5) DECM_ONE(T, S, 128, 6)    \
  DECM_ONE(T, S, 128, 7)
#define DECM512(T, S, HB)                                                                     \
  extern "C" __global__ void __launch_bounds__(DM_THREADS) attn_dec_mma_##S##_d512_h##HB(     \
      T* out, float* pa, float* pm, int* cnt, const T* q, const T* k, const T* v,             \
      const int* bt, const int* sl, const int* cu, int H, int KH, int bs, int mb, int ns,     \
      int nsp, float sc, float kvs, int win) {                                                \
    AttnArgs a{H, KH, bs, mb, ns, nsp, sc, kvs, win};                                          \
    attn_dec_mma512_impl<T, HB>(out, pa, pm, cnt, q, k, v, bt, sl, cu, a);                    \
  }                                                                                           \
  extern "C" __global__ void __launch_bounds__(DM_THREADS) attn_dec_mma_##S##_d512_h##HB##_x( \
      T* out, float* pa, float* pm, int* cnt, const T* q, const T* k, const T* v,             \
      const int* bt, const int* sl, const int* cu, int H, int KH, int bs, int mb, int ns,     \
      int nsp, float sc, float kvs, int win) {                                                \
    AttnArgs a{H, KH, bs, mb, ns, nsp, sc, kvs, win};                                          \
    attn_dec_mma512_impl<T, HB, false>(out, pa, pm, cnt, q, k, v, bt, sl, cu, a);             \
  }
// attn_dec_merge_<dtype>_d<D>: the partials of attn_dec_mma_*_d<D>_h*_x, a block (D / 4
// threads) a (token, head); the split rule's tile: 64 keys, 32 at 512
#define DECM_MERGE(T, S, D, BN)                                                               \
  extern "C" __global__ void __launch_bounds__(128) attn_dec_merge_##S##_d##D(                \
      T* out, const float* pa, const float* pm, const int* sl, const int* cu, int H, int ns,  \
      int nsp, int win, float kvs) {                                                          \
    attn_dec_merge_impl<T, D, BN>(out, pa, pm, sl, cu, H, ns, nsp, win, kvs);                 \
  }
#define DECM512_MERGE(T, S) DECM_MERGE(T, S, 64, DM_BN) DECM_MERGE(T, S, 128, DM_BN)          \
  DECM_MERGE(T, S, 256, DM_BN) DECM_MERGE(T, S, 512, DW_BN)
#define DECM(T, S) DECM_D(T, S, 64) DECM_D(T, S, 128) DECM_D(T, S, 256) DECM512(T, S, 2)       \
  DECM512(T, S, 4) DECM512(T, S, 8) DECM512(T, S, 16) DECM_ODD(T, S)        \
  DECM512_MERGE(T, S)
INSTANTIATE(DECM)
#endif
