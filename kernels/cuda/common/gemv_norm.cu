// Decode GEMVs (M <= 8 rows of x) with an optional RMSNorm prologue:
//   gemvn_*_m{MT}_g{G}           y = x @ W^T (+ bias)
//   gemvn_norm_*_m{MT}_g{G}      y = rms_norm(x (+ residual)) @ W^T (+ bias)   (rms_norm_linear)
//   gemvn_norm_act_*_m{MT}_g{G}  y = act(h @ Wg^T + bg) * (h @ Wu^T + bu), h the normed rows, for
//                                W = [Wg; Wu] (the gated MLP's gate_up after its pre-norm)
//   gemvn_norm2_act_*_m{MT}_g1   the same after x's own norm: h = rms_norm(rms_norm(x, xnw) + res),
//                                block 0 also writing rms_norm(that sum, nw2) (Gemma's ffn_in)
// 256 threads = 8 warps. S (runtime: 1, 2, 4 or 8) warps share a group of G output columns,
// splitting K chunk by chunk (chunk = 256 elements, a lane's 16 bytes each) and summing through
// shared memory; a block covers 8 / S * G columns. Each lane keeps a group of chunks of every row
// it reads in flight and loads the next group before using the current one.
// The first weight group is loaded before griddepcontrol.wait (weights never depend on the
// previous kernel), so it overlaps the previous kernel's tail; the _p2 kernels load the second
// group there too (a plain GEMV after a latency-bound kernel: H200 batch 1 qwen3-30b-a3b
// 404.3 -> 411.4 tok/s, while after a GEMV the early loads only slow its tail: 8b 238.8 ->
// 229.3 when always on);
// with pf the first warp of each column group also asks L2 for its whole rows there, so a
// matrix that fits in L2 streams from DRAM while short kernels before it still run.
// With the norm, the prologue overlaps too: every block normalises the M rows itself into shared
// memory, the norm weight loaded before the wait and a row's x and residual (from L2) all at once
// for K <= 8192 (one round trip: H200 batch 1 qwen3-8b 235.6 -> 241.1 tok/s against two sweeps),
// rounded to T exactly as rms_norm stores them; block 0 writes the summed residual stream and,
// when hn is given, the normed rows (the MoE router: its experts read them).
#include "common.cuh"
#include "norm_rows.cuh"

template <typename T, int R, int CH>
__device__ __forceinline__ void gemvn_load(Vec8<T> (&wv)[R][CH], const T* const (&rows)[R],
                                           int chunk, int S, int K) {
  int lane8 = (threadIdx.x & 31) * 8;
#pragma unroll
  for (int c = 0; c < CH; c++) {
    int k = (chunk + c * S) * 256 + lane8;
#pragma unroll
    for (int r = 0; r < R; r++) {
      if (k < K) wv[r][c].load(rows[r] + k);
      else wv[r][c] = Vec8<T>();
    }
  }
}

template <typename T, int MT, int G, bool PAIR, bool NORM, bool PRE2 = false, bool NORM2 = false>
__device__ void gemvn_impl(T* __restrict__ y, T* r_out, T* h_out, const T* x, const T* residual,
                           const T* nw, float eps, int zc, const T* __restrict__ w,
                           const T* __restrict__ bias, int M, int N, int K, int m0, int S,
                           int pf, int gelu, const T* xnw = nullptr, T* h2_out = nullptr,
                           const T* nw2 = nullptr) {
  constexpr int R = PAIR ? 2 * G : G, CH = R >= 4 ? 2 : 4;
  extern __shared__ __align__(16) unsigned char gemvn_smem[];
  __shared__ float red[8 * R * MT];
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int part = warp % S, n0 = (blockIdx.x * (8 / S) + warp / S) * G;
  const T* rows[R];
#pragma unroll
  for (int g = 0; g < G; g++) {
    int n = min(n0 + g, N - 1);
    rows[g] = w + (long long)n * K;
    if (PAIR) rows[G + g] = w + (long long)(N + n) * K;
  }
  if (pf && part == 0)
#pragma unroll
    for (int r = 0; r < R; r++)
      if (lane == r) prefetch_l2_range(rows[r], K * sizeof(T));
  Vec8<T> cur[R][CH], nxt[R][CH];
  gemvn_load<T, R, CH>(cur, rows, part, S, K);
  // PRE2 (the _p2 kernels): the second group too, both register stages in flight before the
  // wait; their own kernels, as holding both takes a kernel to ~128 registers
  if (PRE2 && (part + CH * S) * 256 < K) gemvn_load<T, R, CH>(nxt, rows, part + CH * S, S, K);
  NormWeight<T> nwp;
  if (NORM) norm_weight_preload<T>(nwp, nw, K);
  pdl_trigger();
  pdl_wait();
  const T* xb = x + (long long)m0 * K;
  if (NORM) {
    T* xs = reinterpret_cast<T*>(gemvn_smem);
    norm_rows_to_shared<T, MT, NORM2>(xs, r_out, h_out, x, residual, nw, eps, zc, M, K, m0,
                                      &nwp, xnw, h2_out, nw2);
    xb = xs;
  }
  float acc[R][MT];
#pragma unroll
  for (int r = 0; r < R; r++)
#pragma unroll
    for (int m = 0; m < MT; m++) acc[r][m] = 0.f;
  for (int chunk = part;;) {
    int next = chunk + CH * S;
    bool more = next * 256 < K;
    // PRE2: nxt already holds group `next` (loaded before the wait or at the end of the last
    // iteration, after the move); else it is issued now, while cur is used
    if (!PRE2 && more) gemvn_load<T, R, CH>(nxt, rows, next, S, K);
#pragma unroll
    for (int c = 0; c < CH; c++) {
      int k = (chunk + c * S) * 256 + lane * 8;
      if (k < K) {
        float wf[R][8];
#pragma unroll
        for (int r = 0; r < R; r++) cur[r][c].to_float(wf[r]);
#pragma unroll
        for (int m = 0; m < MT; m++) {
          if (m0 + m < M) {
            float xf[8]; Vec8<T> xv; xv.load(xb + (long long)m * K + k); xv.to_float(xf);
#pragma unroll
            for (int r = 0; r < R; r++)
#pragma unroll
              for (int j = 0; j < 8; j++) acc[r][m] += wf[r][j] * xf[j];
          }
        }
      }
    }
    if (!more) break;
#pragma unroll
    for (int c = 0; c < CH; c++)
#pragma unroll
      for (int r = 0; r < R; r++) cur[r][c] = nxt[r][c];
    if (PRE2 && (next + CH * S) * 256 < K) gemvn_load<T, R, CH>(nxt, rows, next + CH * S, S, K);
    chunk = next;
  }
#pragma unroll
  for (int r = 0; r < R; r++)
#pragma unroll
    for (int m = 0; m < MT; m++) acc[r][m] = warp_sum(acc[r][m]);
  if (S > 1) {
    if (lane == 0)
#pragma unroll
      for (int r = 0; r < R; r++)
#pragma unroll
        for (int m = 0; m < MT; m++) red[(warp * R + r) * MT + m] = acc[r][m];
    __syncthreads();
    if (part) return;
    for (int p = 1; p < S; p++)
#pragma unroll
      for (int r = 0; r < R; r++)
#pragma unroll
        for (int m = 0; m < MT; m++) acc[r][m] += red[((warp + p) * R + r) * MT + m];
  }
  if (lane) return;
#pragma unroll
  for (int g = 0; g < G; g++) {
    int n = n0 + g;
    if (n >= N) break;
    float b = bias ? to_f32(bias[n]) : 0.f;
    float bu = PAIR && bias ? to_f32(bias[N + n]) : 0.f;
#pragma unroll
    for (int m = 0; m < MT; m++) {
      if (m0 + m >= M) break;
      float v = acc[g][m] + b;
      if (PAIR) {
        float u = to_f32(from_f32<T>(acc[G + g][m] + bu));
        v = gated_act(to_f32(from_f32<T>(v)), gelu) * u;
      }
      y[(long long)(m0 + m) * N + n] = from_f32<T>(v);
    }
  }
}

#define GEMVN(T, S, MT, G)                                                                    \
  extern "C" __global__ void __launch_bounds__(256) gemvn_##S##_m##MT##_g##G(                \
      T* y, const T* x, const T* w, const T* bias, int M, int N, int K, int m0, int s,        \
      int pf) {                                                                               \
    gemvn_impl<T, MT, G, false, false>(y, nullptr, nullptr, x, nullptr, nullptr, 0.f, 0, w,  \
                                       bias, M, N, K, m0, s, pf, 0);                          \
  }
#define GEMVN_NORM_ONLY(T, S, MT, G)                                                          \
  extern "C" __global__ void __launch_bounds__(256) gemvn_norm_##S##_m##MT##_g##G(           \
      T* y, T* r, T* hn, const T* x, const T* res, const T* nw, float eps, int zc,            \
      const T* w, const T* bias, int M, int N, int K, int m0, int s, int pf) {                \
    gemvn_impl<T, MT, G, false, true>(y, r, hn, x, res, nw, eps, zc, w, bias, M, N, K, m0, s, \
                                      pf, 0);                                                 \
  }
#define GEMVN_NORM(T, S, MT, G)                                                               \
  GEMVN_NORM_ONLY(T, S, MT, G)                                                                \
  extern "C" __global__ void __launch_bounds__(256) gemvn_norm_act_##S##_m##MT##_g##G(       \
      T* y, T* r, T* hn, const T* x, const T* res, const T* nw, float eps, int zc,            \
      const T* w, const T* bias, int M, int N, int K, int m0, int s, int pf, int gelu) {      \
    gemvn_impl<T, MT, G, true, true>(y, r, hn, x, res, nw, eps, zc, w, bias, M, N, K, m0, s,  \
                                     pf, gelu);                                               \
  }
// norm2_act (Gemma's ffn_in): x (the attention output) normed with its own weight xnw first,
// then as norm_act; block 0 also writes rms_norm(x' + res, nw2) (the experts' input) into h2
#define GEMVN_NORM2(T, S, MT, G)                                                              \
  extern "C" __global__ void __launch_bounds__(256) gemvn_norm2_act_##S##_m##MT##_g##G(      \
      T* y, T* r, T* h2, const T* x, const T* res, const T* xnw, const T* nw, const T* nw2,   \
      float eps, int zc, const T* w, const T* bias, int M, int N, int K, int m0, int s,       \
      int pf, int gelu) {                                                                     \
    gemvn_impl<T, MT, G, true, true, false, true>(y, r, nullptr, x, res, nw, eps, zc, w,      \
                                                  bias, M, N, K, m0, s, pf, gelu, xnw, h2,    \
                                                  nw2);                                       \
  }
// _p2: one row of x, two weight groups loaded before the wait (after a latency-bound kernel)
#define GEMVN_P2(T, S, G)                                                                     \
  extern "C" __global__ void __launch_bounds__(256) gemvn_p2_##S##_m1_g##G(                  \
      T* y, const T* x, const T* w, const T* bias, int M, int N, int K, int m0, int s,        \
      int pf) {                                                                               \
    gemvn_impl<T, 1, G, false, false, true>(y, nullptr, nullptr, x, nullptr, nullptr, 0.f, 0, \
                                            w, bias, M, N, K, m0, s, pf, 0);                  \
  }
#define GEMVN_MT(T, S, MT)                                                                    \
  GEMVN(T, S, MT, 1) GEMVN(T, S, MT, 2) GEMVN(T, S, MT, 4)                                    \
  GEMVN_NORM(T, S, MT, 1) GEMVN_NORM(T, S, MT, 2) GEMVN_NORM_ONLY(T, S, MT, 4)
// norm2_act: one column a warp only (what gemv_tile gives a gated GEMV; fewer kernels to
// build), m1-m8 in the 2-byte types, m1 only in float (its m2-m8 spill 12-24 bytes; float
// models are the tests', one row a tile at the default gemv_rows)
#define GEMVN_NORM2_ROWS_bf16(T, S)                                                           \
  GEMVN_NORM2(T, S, 2, 1) GEMVN_NORM2(T, S, 4, 1) GEMVN_NORM2(T, S, 8, 1)
#define GEMVN_NORM2_ROWS_f16(T, S) GEMVN_NORM2_ROWS_bf16(T, S)
#define GEMVN_NORM2_ROWS_f32(T, S)
#define GEMVNS(T, S)                                                                          \
  GEMVN_MT(T, S, 1) GEMVN_MT(T, S, 2) GEMVN_MT(T, S, 4) GEMVN_MT(T, S, 8)                     \
  GEMVN_P2(T, S, 1) GEMVN_P2(T, S, 2) GEMVN_P2(T, S, 4)                                       \
  GEMVN_NORM2(T, S, 1, 1) GEMVN_NORM2_ROWS_##S(T, S)
INSTANTIATE(GEMVNS)
