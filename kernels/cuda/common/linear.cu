// linear: y[M, N] = x[M, K] @ W[N, K]^T (+ bias), float32 accumulation (at most 8 rows: the
// decode GEMVs of gemv_norm.cu).
// gemm_*: tensor-core path (mma.sync m16n8k16, cp.async double buffering) for larger M.
#include "common.cuh"
#include "mma.cuh"

// Block tile BM x BN, K step 32, warps WM x WN; shared rows padded to 40 elements so the
// eight 16-byte rows one ldmatrix reads fall in distinct banks. K must be a multiple of 8.
template <typename T, int BM, int BN, int WM, int WN, int STAGES>
__device__ void gemm_impl(T* __restrict__ y, const T* __restrict__ x, const T* __restrict__ w,
                          const T* __restrict__ bias, int M, int N, int K) {
  constexpr int BK = 32, LD = 40, TM = BM / WM / 16, TN = BN / WN / 8;
  constexpr int THREADS = WM * WN * 32;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sa = reinterpret_cast<T*>(smem_raw);
  T* sb = sa + STAGES * BM * LD;
  int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  int wm = warp / WN, wn = warp % WN;
  int bm0 = blockIdx.y * BM, bn0 = blockIdx.x * BN;
  float acc[TM][TN][4];
#pragma unroll
  for (int i = 0; i < TM; i++)
#pragma unroll
    for (int j = 0; j < TN; j++)
#pragma unroll
      for (int c = 0; c < 4; c++) acc[i][j][c] = 0.f;

  auto load_tile = [&](int stage, int k0) {
    T* a = sa + stage * BM * LD;
    T* b = sb + stage * BN * LD;
#pragma unroll
    for (int c = tid; c < BM * 4; c += THREADS) {
      int r = c >> 2, kc = (c & 3) * 8;
      int gm = bm0 + r, gk = k0 + kc;
      bool ok = gm < M && gk < K;
      cp_async16(a + r * LD + kc, x + (long long)(ok ? gm : 0) * K + (ok ? gk : 0), ok);
    }
#pragma unroll
    for (int c = tid; c < BN * 4; c += THREADS) {
      int r = c >> 2, kc = (c & 3) * 8;
      int gn = bn0 + r, gk = k0 + kc;
      bool ok = gn < N && gk < K;
      cp_async16(b + r * LD + kc, w + (long long)(ok ? gn : 0) * K + (ok ? gk : 0), ok);
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
    const T* a = sa + (kt % STAGES) * BM * LD;
    const T* b = sb + (kt % STAGES) * BN * LD;
#pragma unroll
    for (int kk = 0; kk < BK; kk += 16) {
      u32 af[TM][4], bfr[TN][2];
#pragma unroll
      for (int i = 0; i < TM; i++) {
        int r = wm * (BM / WM) + i * 16 + (lane & 15);
        ldmatrix_x4(af[i], a + r * LD + kk + (lane >> 4) * 8);
      }
#pragma unroll
      for (int j = 0; j < TN; j += 2) {
        int mi = lane >> 3;
        int r = wn * (BN / WN) + j * 8 + (mi >> 1) * 8 + (lane & 7);
        u32 t[4];
        ldmatrix_x4(t, b + r * LD + kk + (mi & 1) * 8);
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
    for (int j = 0; j < TN; j++) {
      int n = bn0 + wn * (BN / WN) + j * 8 + (lane & 3) * 2;
#pragma unroll
      for (int h = 0; h < 2; h++) {
        int m = bm0 + wm * (BM / WM) + i * 16 + (lane >> 2) + h * 8;
        if (m >= M) continue;
#pragma unroll
        for (int e = 0; e < 2; e++) {
          if (n + e < N) {
            float v = acc[i][j][h * 2 + e] + (bias ? to_f32(bias[n + e]) : 0.f);
            y[(long long)m * N + n + e] = from_f32<T>(v);
          }
        }
      }
    }
  }
}

// Any K (no alignment needed): warp per (m, n). For shapes the fast paths cannot take.
template <typename T>
__device__ void linear_scalar_impl(T* y, const T* x, const T* w, const T* bias, int M, int N,
                                   int K) {
  long long idx = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  int lane = threadIdx.x & 31;
  if (idx >= (long long)M * N) return;
  int m = idx / N, n = idx % N;
  float s = 0.f;
  for (int k = lane; k < K; k += 32) s += to_f32(x[(long long)m * K + k]) * to_f32(w[(long long)n * K + k]);
  s = warp_sum(s);
  if (lane == 0) y[idx] = from_f32<T>(s + (bias ? to_f32(bias[n]) : 0.f));
}

#define LINEAR_SCALAR(T, S)                                                                   \
  extern "C" __global__ void linear_scalar_##S(T* y, const T* x, const T* w, const T* b,     \
                                               int M, int N, int K) {                         \
    linear_scalar_impl<T>(y, x, w, b, M, N, K);                                               \
  }
INSTANTIATE(LINEAR_SCALAR)

#define GEMM(T, S, BM, BN, WM, WN, ST)                                                       \
  extern "C" __global__ void __launch_bounds__(WM * WN * 32) gemm_##S##_##BM##x##BN(         \
      T* y, const T* x, const T* w, const T* bias, int M, int N, int K) {                     \
    gemm_impl<T, BM, BN, WM, WN, ST>(y, x, w, bias, M, N, K);                                 \
  }
#define GEMMS(T, S) GEMM(T, S, 128, 128, 2, 4, 3) GEMM(T, S, 64, 128, 2, 4, 3) GEMM(T, S, 32, 64, 1, 4, 4)
#if ATLAS_MMA
INSTANTIATE(GEMMS)
#endif
