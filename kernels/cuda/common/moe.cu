// Mixture of experts: top-k routing and the grouped expert path.
// Routing: a warp per token picks its top-k (moe_route_w<PL>). Few tokens take the per-pair
// GEMV kernels of moe_decode.cu. Many tokens (grouped path): moe_align sorts the (token, slot)
// pairs by expert into BM-row tiles, moe_gemm_gate_up / moe_gemm_down run one tensor-core GEMM
// tile per (expert tile, column tile), so each expert's weights are read once per tile instead
// of once per token, and moe_combine sums each token's experts in slot order (deterministic, no
// atomics). Pairs of weight exactly 0 (expert parallelism: another rank's expert, mapped to id
// 0) are left out of the sort and of the combine, so they add no rows to expert 0's tiles.
#include "common.cuh"
#include "mma.cuh"
#include "moe_topk.cuh"

// A warp per token (E <= 32 * PL, top_k <= 32): the warp top-k of moe_topk.cuh over the
// token's router logits (T, or float).
template <typename T, int PL>
__device__ void moe_route_impl(float* weights, int* ids, const T* logits, int ntok, int E,
                               int top_k, int renorm, int sigmoid) {
  pdl_wait();
  pdl_trigger();
  int t = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (t >= ntok) return;
  ms_topk<PL, T>(weights + (long long)t * top_k, ids + (long long)t * top_k,
                 logits + (long long)t * E, E, top_k, renorm, sigmoid);
}

// Grouped path, step 1 (one block of 1024 threads, E <= 1024): sorted[max_tiles * BM] lists the
// pair ids of non-zero weight grouped by expert, each expert's run padded to whole BM-row tiles
// with -1; tile_expert[max_tiles] is each tile's expert, -1 past the used tiles.
__device__ void moe_align_impl(int* sorted, int* tile_expert, const int* ids, const float* wts,
                               int P, int E, int BM, int max_tiles) {
  __shared__ int cnt[1024];
  __shared__ int cursor[1024];
  for (int e = threadIdx.x; e < E; e += blockDim.x) cnt[e] = 0;
  for (int i = threadIdx.x; i < max_tiles * BM; i += blockDim.x) sorted[i] = -1;
  __syncthreads();
  for (int p = threadIdx.x; p < P; p += blockDim.x)
    if (wts[p] != 0.f) atomicAdd(&cnt[ids[p]], 1);
  __syncthreads();
  if (threadIdx.x == 0) {
    int tile = 0;
    for (int e = 0; e < E; e++) {
      cursor[e] = tile * BM;
      int n = (cnt[e] + BM - 1) / BM;
      for (int j = 0; j < n; j++) tile_expert[tile + j] = e;
      tile += n;
    }
    for (; tile < max_tiles; tile++) tile_expert[tile] = -1;
  }
  __syncthreads();
  for (int p = threadIdx.x; p < P; p += blockDim.x)
    if (wts[p] != 0.f) sorted[atomicAdd(&cursor[ids[p]], 1)] = p;
}

// Step 2: y[p, :] = A[p / a_div, :] @ W_e^T for the BM pairs p of tile blockIdx.y (expert e).
// GATED (gate_up): W_e has 2N rows; the B tile interleaves 8 gate rows with the 8 matching up
// rows, so each thread holds gate and up of the same outputs and writes act(gate) * up (BN/2
// columns per block). Otherwise (down): N rows, BN columns. K is a multiple of 8.
template <typename T, int BM, int BN, int WM, int WN, int STAGES, bool GATED>
__device__ void moe_gemm_impl(T* __restrict__ y, const T* __restrict__ a, const T* __restrict__ w,
                              const int* __restrict__ sorted, const int* __restrict__ tile_expert,
                              int a_div, int N, int K, int gelu) {
  constexpr int BK = 32, LD = 40, TM = BM / WM / 16, TN = BN / WN / 8;
  constexpr int THREADS = WM * WN * 32;
  __shared__ int rows[BM];
  int e = tile_expert[blockIdx.y];
  if (e < 0) return;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sa = reinterpret_cast<T*>(smem_raw);
  T* sb = sa + STAGES * BM * LD;
  int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  int wm = warp / WN, wn = warp % WN;
  int col0 = blockIdx.x * (GATED ? BN / 2 : BN);
  const T* we = w + (long long)e * (GATED ? 2 * N : N) * K;
  for (int r = tid; r < BM; r += THREADS) rows[r] = sorted[blockIdx.y * BM + r];
  __syncthreads();
  float acc[TM][TN][4];
#pragma unroll
  for (int i = 0; i < TM; i++)
#pragma unroll
    for (int j = 0; j < TN; j++)
#pragma unroll
      for (int c = 0; c < 4; c++) acc[i][j][c] = 0.f;

  auto load_tile = [&](int stage, int k0) {
    T* as = sa + stage * BM * LD;
    T* bs = sb + stage * BN * LD;
#pragma unroll
    for (int c = tid; c < BM * 4; c += THREADS) {
      int r = c >> 2, kc = (c & 3) * 8, gk = k0 + kc, p = rows[r];
      bool ok = p >= 0 && gk < K;
      cp_async16(as + r * LD + kc, a + (long long)(ok ? p / a_div : 0) * K + (ok ? gk : 0), ok);
    }
#pragma unroll
    for (int c = tid; c < BN * 4; c += THREADS) {
      int r = c >> 2, kc = (c & 3) * 8, gk = k0 + kc;
      int n = GATED ? col0 + (r >> 4) * 8 + (r & 7) : col0 + r;
      int wr = GATED && (r & 8) ? N + n : n;
      bool ok = n < N && gk < K;
      cp_async16(bs + r * LD + kc, we + (long long)(ok ? wr : 0) * K + (ok ? gk : 0), ok);
    }
  };

  int num_k = (K + BK - 1) / BK;
#pragma unroll
  for (int s = 0; s < STAGES - 1; s++) {
    if (s < num_k) load_tile(s, s * BK);
    asm volatile("cp.async.commit_group;\n");
  }
  for (int kt = 0; kt < num_k; kt++) {
    int nk = kt + STAGES - 1;
    if (nk < num_k) load_tile(nk % STAGES, nk * BK);
    asm volatile("cp.async.commit_group;\n");
    asm volatile("cp.async.wait_group %0;\n" :: "n"(STAGES - 1));
    __syncthreads();
    const T* as = sa + (kt % STAGES) * BM * LD;
    const T* bs = sb + (kt % STAGES) * BN * LD;
#pragma unroll
    for (int kk = 0; kk < BK; kk += 16) {
      u32 af[TM][4], bfr[TN][2];
#pragma unroll
      for (int i = 0; i < TM; i++) {
        int r = wm * (BM / WM) + i * 16 + (lane & 15);
        ldmatrix_x4(af[i], as + r * LD + kk + (lane >> 4) * 8);
      }
#pragma unroll
      for (int j = 0; j < TN; j += 2) {
        int mi = lane >> 3;
        int r = wn * (BN / WN) + j * 8 + (mi >> 1) * 8 + (lane & 7);
        u32 t[4];
        ldmatrix_x4(t, bs + r * LD + kk + (mi & 1) * 8);
        bfr[j][0] = t[0]; bfr[j][1] = t[1]; bfr[j + 1][0] = t[2]; bfr[j + 1][1] = t[3];
      }
#pragma unroll
      for (int i = 0; i < TM; i++)
#pragma unroll
        for (int j = 0; j < TN; j++) mma16816<T>(acc[i][j], af[i], bfr[j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < TM; i++) {
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
      int p = rows[wm * (BM / WM) + i * 16 + (lane >> 2) + hh * 8];
      if (p < 0) continue;
#pragma unroll
      for (int j = 0; j < TN; j += (GATED ? 2 : 1)) {
        int c = wn * (BN / WN) + j * 8;
        int n = (GATED ? col0 + (c >> 4) * 8 : col0 + c) + (lane & 3) * 2;
#pragma unroll
        for (int q = 0; q < 2; q++) {
          if (n + q >= N) continue;
          float v = acc[i][j][hh * 2 + q];
          if (GATED) v = gated_act(v, gelu) * acc[i][j + 1][hh * 2 + q];
          y[(long long)p * N + n + q] = from_f32<T>(v);
        }
      }
    }
  }
}

// Step 3: out[t, :] = sum_j weights[t, j] * yp[t * top_k + j, :], slots in order; slots of
// weight 0 were never computed (moe_align left them out), so their rows are not read.
template <typename T>
__device__ void moe_combine_impl(T* out, const T* yp, const float* weights, int top_k,
                                 int hidden) {
  int t = blockIdx.y;
  for (int c = (blockIdx.x * blockDim.x + threadIdx.x) * 8; c < hidden;
       c += gridDim.x * blockDim.x * 8) {
    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    for (int j = 0; j < top_k; j++) {
      long long p = (long long)t * top_k + j;
      float wt = weights[p], f[8];
      if (wt == 0.f) continue;
      Vec8<T> v; v.load(yp + p * hidden + c); v.to_float(f);
#pragma unroll
      for (int i = 0; i < 8; i++) acc[i] += wt * f[i];
    }
    Vec8<T> o; o.from_float(acc); o.store(out + (long long)t * hidden + c);
  }
}

#define MOE_ROUTE(T, S, PL)                                                                   \
  extern "C" __global__ void moe_route_w##PL##_##S(float* wts, int* ids, const T* logits,      \
                                                   int ntok, int E, int k, int renorm,         \
                                                   int sig) {                                  \
    moe_route_impl<T, PL>(wts, ids, logits, ntok, E, k, renorm, sig);                          \
  }
#define MOE(T, S) MOE_ROUTE(T, S, 4) MOE_ROUTE(T, S, 8) MOE_ROUTE(T, S, 32)
INSTANTIATE(MOE)

#define MOE_GROUPED(T, S)                                                                     \
  extern "C" __global__ void moe_align_##S(int* sorted, int* tiles, const int* ids,           \
                                           const float* wts, int P, int E, int BM,            \
                                           int max_tiles) {                                   \
    moe_align_impl(sorted, tiles, ids, wts, P, E, BM, max_tiles);                             \
  }                                                                                           \
  extern "C" __global__ void moe_combine_##S(T* out, const T* yp, const float* wts, int k,     \
                                             int hidden) {                                    \
    moe_combine_impl<T>(out, yp, wts, k, hidden);                                             \
  }
INSTANTIATE(MOE_GROUPED)

#define MOE_GEMM(T, S, BM, WM, ST)                                                            \
  extern "C" __global__ void __launch_bounds__(WM * 4 * 32) moe_gemm_gate_up_##S##_##BM(     \
      T* h, const T* x, const T* w, const int* sorted, const int* tiles, int top_k, int inter,\
      int hidden, int gelu) {                                                                 \
    moe_gemm_impl<T, BM, 128, WM, 4, ST, true>(h, x, w, sorted, tiles, top_k, inter, hidden,  \
                                               gelu);                                         \
  }                                                                                           \
  extern "C" __global__ void __launch_bounds__(WM * 4 * 32) moe_gemm_down_##S##_##BM(        \
      T* y, const T* h, const T* w, const int* sorted, const int* tiles, int hidden,          \
      int inter) {                                                                            \
    moe_gemm_impl<T, BM, 128, WM, 4, ST, false>(y, h, w, sorted, tiles, 1, hidden, inter, 0); \
  }
#define MOE_GEMMS(T, S) MOE_GEMM(T, S, 16, 1, 4) MOE_GEMM(T, S, 64, 2, 3)
#if ATLAS_MMA
INSTANTIATE(MOE_GEMMS)
#endif
