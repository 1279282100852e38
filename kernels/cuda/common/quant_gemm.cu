// Skinny quantized GEMM on the tensor cores (9 to 64 rows a launch; W8A16 / W4A16):
//   qgemm_{fp8,nvfp4}_*_m{MT}_n{TN}   y[M, N] = x[M, K] @ dequant(W)^T (+ bias), M <= 16 * MT
// Each lane streams one 16-byte weight chunk (16 fp8 / 32 e2m1 values) of each of the warp's TN
// groups of 8 columns straight into registers, dequantizes it and feeds it to mma.sync
// m16n8k16 as B fragments: no shared-memory staging, each weight byte read once per launch.
// The K order inside a slab of 4 chunks (4 * E elements) is permuted so that a lane's chunk is
// its own fragment data: lane (g = lane / 4, t = lane % 4) holds K elements
// [E t, E t + E) of the slab, and mma step j (0 .. E/4 - 1) reads from them the fragment
// elements 2t, 2t + 1 at E t + 4j + {0, 1} and 2t + 8, 2t + 9 at E t + 4j + {2, 3}, for A (rows
// of x, read as 16-byte vectors through L1) and B alike; lanes past K (a last partial slab) use
// zeros. A block's 8 warps share its 8 * TN
// columns and split the slabs of K, summing into a shared-memory tile at the end.
#include "common.cuh"
#include "mma.cuh"
#include "quant_common.cuh"

// Word i of a register array of 16-byte vectors (i a compile-time constant after unrolling).
__device__ __forceinline__ u32 word4(const uint4* v, int i) {
  const uint4& q = v[i >> 2];
  return (i & 3) == 0 ? q.x : (i & 3) == 1 ? q.y : (i & 3) == 2 ? q.z : q.w;
}

template <typename T, int FMT, int MT, int TN>
__device__ void qgemm_impl(T* __restrict__ y, const T* __restrict__ x,
                           const unsigned char* __restrict__ w, QScale q,
                           const T* __restrict__ bias, int M, int N, int K, int m0) {
  constexpr int E = QChunk<FMT>::ELEMS, STEPS = E / 4, GROUPS = E / 16;
  __shared__ float tile[16 * MT][8 * TN];
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  int n_base = blockIdx.x * 8 * TN;
  for (int i = threadIdx.x; i < 16 * MT * 8 * TN; i += blockDim.x) (&tile[0][0])[i] = 0.f;
  long long row_bytes = K / QChunk<FMT>::BYTES_PER_ROW_DIV;
  const unsigned char* wr[TN];
  int wn[TN];
#pragma unroll
  for (int j = 0; j < TN; j++) {
    wn[j] = min(n_base + 8 * j + g, N - 1);
    wr[j] = w + (long long)wn[j] * row_bytes;
  }
  int chunks = K / E, slabs = (chunks + 3) / 4;
  uint4 cur[TN];
#pragma unroll
  for (int j = 0; j < TN; j++)
    cur[j] = warp * 4 + t < chunks
                 ? *reinterpret_cast<const uint4*>(wr[j] + (long long)(warp * 4 + t) * 16)
                 : make_uint4(0, 0, 0, 0);
  pdl_trigger();
  pdl_wait();
  float gs = FMT == 1 ? q.gscale[0] : 1.f;
  float acc[MT][TN][4];
#pragma unroll
  for (int i = 0; i < MT; i++)
#pragma unroll
    for (int j = 0; j < TN; j++)
#pragma unroll
      for (int c = 0; c < 4; c++) acc[i][j][c] = 0.f;
  for (int s = warp; s < slabs; s += 8) {
    bool live = s * 4 + t < chunks;
    int k = live ? (s * 4 + t) * E : 0;
    u32 bw[TN][E / 2];
#pragma unroll
    for (int j = 0; j < TN; j++) {
      float wf[E], sc[GROUPS];
      QChunk<FMT>::decode(cur[j], wf);
      QChunk<FMT>::scales(q, wn[j], k, K, gs, sc);
#pragma unroll
      for (int e = 0; e < E / 2; e++)
        bw[j][e] = pack2<T>(wf[2 * e] * sc[(2 * e) / 16], wf[2 * e + 1] * sc[(2 * e) / 16]);
    }
#pragma unroll
    for (int j = 0; j < TN; j++)
      cur[j] = (s + 8) * 4 + t < chunks
                   ? *reinterpret_cast<const uint4*>(wr[j] + (long long)((s + 8) * 4 + t) * 16)
                   : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int i = 0; i < MT; i++) {
      int r0 = min(m0 + 16 * i + g, M - 1), r1 = min(m0 + 16 * i + g + 8, M - 1);
      uint4 xa[E / 8], xb[E / 8];
#pragma unroll
      for (int v = 0; v < E / 8; v++) {
        xa[v] = live ? *reinterpret_cast<const uint4*>(x + (long long)r0 * K + k + 8 * v)
                     : make_uint4(0, 0, 0, 0);
        xb[v] = live ? *reinterpret_cast<const uint4*>(x + (long long)r1 * K + k + 8 * v)
                     : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int st = 0; st < STEPS; st++) {
        u32 a[4] = {word4(xa, 2 * st), word4(xb, 2 * st), word4(xa, 2 * st + 1),
                    word4(xb, 2 * st + 1)};
#pragma unroll
        for (int j = 0; j < TN; j++) {
          u32 b[2] = {bw[j][2 * st], bw[j][2 * st + 1]};
          mma16816<T>(acc[i][j], a, b);
        }
      }
    }
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < MT; i++)
#pragma unroll
    for (int j = 0; j < TN; j++)
#pragma unroll
      for (int c = 0; c < 4; c++)
        atomicAdd(&tile[16 * i + g + 8 * (c >> 1)][8 * j + 2 * t + (c & 1)], acc[i][j][c]);
  __syncthreads();
  for (int i = threadIdx.x; i < 16 * MT * 8 * TN; i += blockDim.x) {
    int r = i / (8 * TN), c = i % (8 * TN), m = m0 + r, n = n_base + c;
    if (m < M && n < N)
      y[(long long)m * N + n] = from_f32<T>(tile[r][c] + (bias ? to_f32(bias[n]) : 0.f));
  }
}

#define QGEMM(T, S, MT, TN)                                                                   \
  extern "C" __global__ void __launch_bounds__(256) qgemm_fp8_##S##_m##MT##_n##TN(           \
      T* y, const T* x, const unsigned char* w, const float* scale, const T* bias, int M,     \
      int N, int K, int m0, int bn, int bk, int s_row) {                                      \
    QScale q{scale, nullptr, bn, bk, s_row};                                                  \
    qgemm_impl<T, 0, MT, TN>(y, x, w, q, bias, M, N, K, m0);                                  \
  }                                                                                           \
  extern "C" __global__ void __launch_bounds__(256) qgemm_nvfp4_##S##_m##MT##_n##TN(         \
      T* y, const T* x, const unsigned char* w, const unsigned char* scale,                    \
      const float* gscale, const T* bias, int M, int N, int K, int m0) {                      \
    QScale q{scale, gscale, 1, 16, 0};                                                        \
    qgemm_impl<T, 1, MT, TN>(y, x, w, q, bias, M, N, K, m0);                                  \
  }
#define QGEMM_MT(T, S, MT) QGEMM(T, S, MT, 1) QGEMM(T, S, MT, 2) QGEMM(T, S, MT, 4)
#define QGEMMS(T, S) QGEMM_MT(T, S, 1) QGEMM_MT(T, S, 2) QGEMM_MT(T, S, 4)
#if ATLAS_MMA
INSTANTIATE(QGEMMS)
#endif
