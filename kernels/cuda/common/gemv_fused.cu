// Decode GEMVs (M <= 8 rows of x) that keep more weight bytes in flight than linear.cu's gemv:
//   gemv8_*         y = x @ W^T (+ bias): a warp per output column, 8 chunks of 256 elements of
//                   its weight row loaded before any arithmetic (8 x 16 bytes in flight per lane).
//   gemv_act_mul_*  y = act(x @ Wg^T + bg) * (x @ Wu^T + bu) for W = [Wg; Wu] (the fused gate_up
//                   projection): a warp reads gate row n and up row n together (4 chunks of each
//                   in flight) and writes one output, so the [M, 2I] projection never exists.
// Both round the projection to T before the activation, as linear + act_and_mul do.
// Launched with programmatic dependent launch on sm_90+: the first weight lines are prefetched
// to L2 before griddepcontrol.wait, since weights never depend on the previous kernel.
#include "common.cuh"

// acc[r][m] += this lane's share of w[r] . x[m0 + m] over k = k0, k0 + CH * 256, ... while a
// whole group of CH chunks fits; returns where it stopped so a shorter group can finish.
template <typename T, int R, int CH, int MT>
__device__ __forceinline__ int dot_chunks(float (&acc)[R][MT], const T* const (&w)[R],
                                          const T* __restrict__ x, int M, int K, int m0, int k) {
  for (; k + (CH - 1) * 256 < K; k += CH * 256) {
    Vec8<T> wv[R][CH];
#pragma unroll
    for (int c = 0; c < CH; c++)
#pragma unroll
      for (int r = 0; r < R; r++) wv[r][c].load(w[r] + k + c * 256);
#pragma unroll
    for (int c = 0; c < CH; c++) {
      float wf[R][8];
#pragma unroll
      for (int r = 0; r < R; r++) wv[r][c].to_float(wf[r]);
#pragma unroll
      for (int m = 0; m < MT; m++) {
        if (m0 + m < M) {
          float xf[8]; Vec8<T> xv; xv.load(x + (long long)(m0 + m) * K + k + c * 256); xv.to_float(xf);
#pragma unroll
          for (int r = 0; r < R; r++)
#pragma unroll
            for (int j = 0; j < 8; j++) acc[r][m] += wf[r][j] * xf[j];
        }
      }
    }
  }
  return k;
}

// Whole rows: groups of CH chunks, then of 4, then single chunks (K a multiple of 8).
template <typename T, int R, int CH, int MT>
__device__ __forceinline__ void dot_rows(float (&acc)[R][MT], const T* const (&w)[R],
                                         const T* __restrict__ x, int M, int K, int m0) {
#pragma unroll
  for (int r = 0; r < R; r++)
#pragma unroll
    for (int m = 0; m < MT; m++) acc[r][m] = 0.f;
  int k = dot_chunks<T, R, CH, MT>(acc, w, x, M, K, m0, (threadIdx.x & 31) * 8);
  k = dot_chunks<T, R, 4, MT>(acc, w, x, M, K, m0, k);
  dot_chunks<T, R, 1, MT>(acc, w, x, M, K, m0, k);
}

template <typename T, int R, int CH>
__device__ __forceinline__ void prefetch_rows(const T* const (&w)[R], int K) {
  int lane = threadIdx.x & 31;
#pragma unroll
  for (int r = 0; r < R; r++)
    for (int c = 0; c < CH && lane * 8 + c * 256 < K; c++)
      asm volatile("prefetch.global.L2 [%0];\n" :: "l"(w[r] + lane * 8 + c * 256));
}

template <typename T, int MT>
__device__ void gemv8_impl(T* __restrict__ y, const T* __restrict__ x, const T* __restrict__ w,
                           const T* __restrict__ bias, int M, int N, int K, int m0) {
  int n = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (n >= N) return;
  const T* rows[1] = {w + (long long)n * K};
  prefetch_rows<T, 1, 8>(rows, K);
  pdl_trigger();
  pdl_wait();
  float acc[1][MT];
  dot_rows<T, 1, 8, MT>(acc, rows, x, M, K, m0);
  float b = bias ? to_f32(bias[n]) : 0.f;
#pragma unroll
  for (int m = 0; m < MT; m++) {
    float s = warp_sum(acc[0][m]);
    if ((threadIdx.x & 31) == 0 && m0 + m < M) y[(long long)(m0 + m) * N + n] = from_f32<T>(s + b);
  }
}

// y[m, n] = act(g) * u, g and u rounded to T first; y is [M, I], w is [2I, K].
template <typename T, int MT>
__device__ void gemv_act_mul_impl(T* __restrict__ y, const T* __restrict__ x,
                                  const T* __restrict__ w, const T* __restrict__ bias, int M,
                                  int I, int K, int m0, int gelu) {
  int n = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (n >= I) return;
  const T* rows[2] = {w + (long long)n * K, w + (long long)(I + n) * K};
  prefetch_rows<T, 2, 4>(rows, K);
  pdl_trigger();
  pdl_wait();
  float acc[2][MT];
  dot_rows<T, 2, 4, MT>(acc, rows, x, M, K, m0);
  float bg = bias ? to_f32(bias[n]) : 0.f, bu = bias ? to_f32(bias[I + n]) : 0.f;
#pragma unroll
  for (int m = 0; m < MT; m++) {
    float g = warp_sum(acc[0][m]), u = warp_sum(acc[1][m]);
    if ((threadIdx.x & 31) == 0 && m0 + m < M) {
      g = to_f32(from_f32<T>(g + bg));
      u = to_f32(from_f32<T>(u + bu));
      y[(long long)(m0 + m) * I + n] = from_f32<T>(gated_act(g, gelu) * u);
    }
  }
}

#define GEMV_FUSED(T, S, MT)                                                                  \
  extern "C" __global__ void __launch_bounds__(256) gemv8_##S##_m##MT(                       \
      T* y, const T* x, const T* w, const T* bias, int M, int N, int K, int m0) {             \
    gemv8_impl<T, MT>(y, x, w, bias, M, N, K, m0);                                           \
  }                                                                                           \
  extern "C" __global__ void __launch_bounds__(256) gemv_act_mul_##S##_m##MT(                \
      T* y, const T* x, const T* w, const T* bias, int M, int I, int K, int m0, int gelu) {   \
    gemv_act_mul_impl<T, MT>(y, x, w, bias, M, I, K, m0, gelu);                              \
  }
#define GEMV_FUSEDS(T, S) GEMV_FUSED(T, S, 1) GEMV_FUSED(T, S, 2) GEMV_FUSED(T, S, 4) GEMV_FUSED(T, S, 8)
INSTANTIATE(GEMV_FUSEDS)
