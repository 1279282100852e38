// Quantized linears for decode batches on the tensor cores, 1 to 64 rows (W8A16 / W4A16), and
// the same kernel over weights already in the activation dtype (dense, FMT 2):
//   qskinny_{fp8,nvfp4}_*_n{NT}_d{D}  y[M, N] = x[M, K] @ dequant(W)^T (+ bias), M <= 8 * NT,
//                                     D steps of weight loads in flight a lane
//   qskinny_dense_*_n{NT}_d{D}        y = x @ W^T (+ bias): a lane's 32 elements of a row a step
//                                     at the FP8 byte offsets (four 16-byte loads), paired for
//                                     the mma the way qx_frag pairs x, so no decode at all
// The weight is the A operand of mma.sync m16n8k16 (16 weight rows a warp) and x the B operand
// (8 rows of x an n-tile), so the weight decode is paid once however many rows x has: 1 to 8
// rows cost the same. Each step a lane reads 32 codes of its two weight rows (FP8: 2 x 16 B,
// NVFP4: 16 B; a warp covers 128 K) and decodes them with integer ops into T pairs that carry a
// known power of two; one packed multiply then restores it (FP8) or applies the 16-element
// group scale (NVFP4), exactly in both cases (the products have at most 6 significant bits).
// No float conversion touches the weights, which is what bounded the older GEMV.
//   FP8 (e4m3) in bf16: sign << 15 | (code & 0x7f) << 4 is the value times 2^-120 (subnormal
//     codes land on bf16 subnormals, same factor); in f16: << 7, times 2^-8.
//   e2m1 in bf16: sign << 15 | (code & 7) << 6 is the value times 2^-126; in f16: << 9, 2^-14.
// The K order inside a lane's 32 codes is what the decoders give (FP8: codes 0 and 2 of a word
// share a register, NVFP4: codes i and i + 4); x is permuted the same way with byte permutes.
// FP8 scales (tensor, channel, block with bk a multiple of 128) multiply each step's partial
// sums; the NVFP4 global scale the result. S warps (1/2/4/8) split K and sum in shared memory.
#include "common.cuh"
#include "mma.cuh"
#include "quant_common.cuh"
#include "norm_rows.cuh"
#include "quant_skinny.cuh"


template <typename T, int FMT, int NT> struct QSkinnyLane {
  const T* x;
  QScale q;
  int M, K, t, g;
  int rows[2];
  const float* srow[2];  // FP8: the scale rows of the lane's two weight rows
  float inv_steps;       // FP8: scale block of step s = (s + 0.5) * inv_steps
  float acc[NT][4];

  // The lane's 32 elements of x row 8 j + g for the step at K offset k0 (zeros past M).
  __device__ __forceinline__ void load_x(uint4 (&xv)[4], int j, int k0) const {
    qx_load<T, FMT>(xv, x, 8 * j + g, M, K, k0, t);
  }

  // Decode the 32 codes of both rows in buf (step s: K [128 s + 32 t, + 32)) and multiply
  // them with every n-tile of x.
  template <int V> __device__ __forceinline__ void step(const uint4 (&buf)[2][V], int s) {
    int k0 = s * 128, k = k0 + 32 * t;  // k: the lane's NVFP4 scale column x 16
    // x of n-tile j for this step: loaded one tile ahead (tile 0 before the decode), so its
    // latency hides behind the decode and the previous tile's MMAs.
    uint4 xv[2][4];
    load_x(xv[0], 0, k0);
    u32 a[8][4];
    float fs[2] = {1.f, 1.f};
    if constexpr (FMT == 2) {
      qdecode_dense(buf, a);
    } else if constexpr (FMT == 0) {
      int blk = (int)(((float)s + 0.5f) * inv_steps);
#pragma unroll
      for (int r = 0; r < 2; r++) fs[r] = srow[r][blk];
      qdecode_fp8<T>(buf, a);
    } else {
      u32 sc[2];
#pragma unroll
      for (int r = 0; r < 2; r++)
        sc[r] = *reinterpret_cast<const unsigned short*>(
            reinterpret_cast<const unsigned char*>(q.scale) + (long long)rows[r] * (K / 16) +
            k / 16);
      qdecode_nvfp4<T>(buf, sc, a);
    }
#pragma unroll
    for (int j = 0; j < NT; j++) {
      if (j + 1 < NT) load_x(xv[(j + 1) & 1], j + 1, k0);
      float c[4] = {0.f, 0.f, 0.f, 0.f};
      float* d = FMT == 0 ? c : acc[j];
#pragma unroll
      for (int st = 0; st < 8; st++) {
        u32 b[2];
        qx_frag<FMT>(xv[j & 1], st, b);
        mma16816<T>(d, a[st], b);
      }
      if (FMT == 0) {
        acc[j][0] += fs[0] * c[0];
        acc[j][1] += fs[0] * c[1];
        acc[j][2] += fs[1] * c[2];
        acc[j][3] += fs[1] * c[3];
      }
    }
  }
};

// D steps of weight loads in flight a lane: a ring of D + 1 register buffers, the loop
// unrolled over it so every buffer index is a constant.
template <typename T, int FMT, int NT, int D, bool NORM = false>
__device__ void qskinny_impl(T* __restrict__ y, const T* __restrict__ x,
                             const unsigned char* __restrict__ w, QScale q,
                             const T* __restrict__ bias, int M, int N, int K, int S,
                             QNorm nq = QNorm{}) {
  using P = QPair<T>;
  constexpr int V = FMT == 0 ? 2 : FMT == 1 ? 1 : 4;  // 16-byte loads of one row a step
  __shared__ float red[8][NT][4][32];
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int part = warp % S, n0 = (blockIdx.x * (8 / S) + warp / S) * 16;
  QSkinnyLane<T, FMT, NT> L;
  L.x = x; L.q = q; L.M = M; L.K = K; L.t = lane & 3; L.g = lane >> 2;
  L.rows[0] = min(n0 + L.g, N - 1);
  L.rows[1] = min(n0 + L.g + 8, N - 1);
  const unsigned char* wr[2];
  long long row_bytes = FMT == 0 ? K : FMT == 1 ? K / 2 : (long long)K * sizeof(T);
#pragma unroll
  for (int r = 0; r < 2; r++) wr[r] = w + (long long)L.rows[r] * row_bytes + qchunk_offset(L.t, 0);
  int steps = n0 < N ? K / 128 : 0;
  uint4 buf[D + 1][2][V];
#pragma unroll
  for (int u = 0; u < D; u++)
    if (part + u * S < steps)
#pragma unroll
      for (int r = 0; r < 2; r++)
#pragma unroll
        for (int v = 0; v < V; v++)
          buf[u][r][v] = ld_stream(wr[r] + (long long)(part + u * S) * 64 * V + 64 * v);
  pdl_trigger();
  pdl_wait();
  if constexpr (NORM) {
    extern __shared__ __align__(16) unsigned char qs_xs[];
    T* xs = reinterpret_cast<T*>(qs_xs);
    norm_rows_to_shared<T, 8>(xs, reinterpret_cast<T*>(nq.r_out), nullptr, x,
                              reinterpret_cast<const T*>(nq.residual),
                              reinterpret_cast<const T*>(nq.nw), nq.eps, nq.zc, M, K, 0);
    L.x = xs;
  }
#pragma unroll
  for (int j = 0; j < NT; j++)
#pragma unroll
    for (int c = 0; c < 4; c++) L.acc[j][c] = 0.f;
  if (FMT == 0) {
#pragma unroll
    for (int r = 0; r < 2; r++)
      L.srow[r] = reinterpret_cast<const float*>(q.scale) + (L.rows[r] / q.bn) * q.s_row;
    L.inv_steps = q.bk >= K ? 0.f : 128.f / (float)q.bk;
  }
  for (int s = part; s < steps;) {
#pragma unroll
    for (int u = 0; u <= D; u++) {
      if (s < steps) {
        int ahead = s + D * S;
        if (ahead < steps)
#pragma unroll
          for (int r = 0; r < 2; r++)
#pragma unroll
            for (int v = 0; v < V; v++)
              buf[(u + D) % (D + 1)][r][v] =
                  ld_stream(wr[r] + (long long)ahead * 64 * V + 64 * v);
        L.step(buf[u], s);
        s += S;
      }
    }
  }
  int lt = L.t, lg = L.g;
  if (S > 1) {
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
      for (int c = 0; c < 4; c++) red[warp][j][c][lane] = L.acc[j][c];
    __syncthreads();
    if (part) return;
    for (int p = 1; p < S; p++)
#pragma unroll
      for (int j = 0; j < NT; j++)
#pragma unroll
        for (int c = 0; c < 4; c++) L.acc[j][c] += red[warp + p][j][c][lane];
  }
  if (n0 >= N) return;
  float out = FMT == 1 ? q.gscale[0] * P::fp4_out() : 1.f;
#pragma unroll
  for (int j = 0; j < NT; j++)
#pragma unroll
    for (int c = 0; c < 4; c++) {
      int m = 8 * j + 2 * lt + (c & 1), n = n0 + lg + 8 * (c >> 1);
      if (m < M && n < N)
        y[(long long)m * N + n] =
            from_f32<T>(L.acc[j][c] * out + (bias ? to_f32(bias[n]) : 0.f));
    }
}

#define QSKINNY_FP8(T, S, NT, D)                                                              \
  extern "C" __global__ void __launch_bounds__(256) qskinny_fp8_##S##_n##NT##_d##D(          \
      T* y, const T* x, const unsigned char* w, const float* scale, const T* bias, int M,     \
      int N, int K, int s, int bn, int bk, int s_row) {                                       \
    QScale q{scale, nullptr, bn, bk, s_row};                                                  \
    qskinny_impl<T, 0, NT, D>(y, x, w, q, bias, M, N, K, s);                                  \
  }
#define QSKINNY_FP4(T, S, NT, D)                                                              \
  extern "C" __global__ void __launch_bounds__(256) qskinny_nvfp4_##S##_n##NT##_d##D(        \
      T* y, const T* x, const unsigned char* w, const unsigned char* scale,                   \
      const float* gscale, const T* bias, int M, int N, int K, int s) {                       \
    QScale q{scale, gscale, 1, 16, 0};                                                        \
    qskinny_impl<T, 1, NT, D>(y, x, w, q, bias, M, N, K, s);                                  \
  }
#define QSKINNY_NORM_FP8(T, S, D)                                                             \
  extern "C" __global__ void __launch_bounds__(256) qskinny_norm_fp8_##S##_n1_d##D(           \
      T* y, const T* x, const unsigned char* w, const float* scale, const T* bias, int M,     \
      int N, int K, int s, int bn, int bk, int s_row, QNORM_ARGS(T)) {                           \
    QScale q{scale, nullptr, bn, bk, s_row};                                                  \
    qskinny_impl<T, 0, 1, D, true>(y, x, w, q, bias, M, N, K, s,                              \
                                   QNorm{r_out, residual, nw, eps, zc});                      \
  }
#define QSKINNY_NORM_FP4(T, S, D)                                                             \
  extern "C" __global__ void __launch_bounds__(256) qskinny_norm_nvfp4_##S##_n1_d##D(         \
      T* y, const T* x, const unsigned char* w, const unsigned char* scale,                   \
      const float* gscale, const T* bias, int M, int N, int K, int s, QNORM_ARGS(T)) {          \
    QScale q{scale, gscale, 1, 16, 0};                                                        \
    qskinny_impl<T, 1, 1, D, true>(y, x, w, q, bias, M, N, K, s,                              \
                                   QNorm{r_out, residual, nw, eps, zc});                      \
  }
#define QSKINNY_DENSE(T, S, NT, D)                                                            \
  extern "C" __global__ void __launch_bounds__(256) qskinny_dense_##S##_n##NT##_d##D(        \
      T* y, const T* x, const unsigned char* w, const T* bias, int M, int N, int K, int s) {  \
    QScale q{nullptr, nullptr, 1, 1, 0};                                                      \
    qskinny_impl<T, 2, NT, D>(y, x, w, q, bias, M, N, K, s);                                  \
  }
// The dense variants the "dense" entries of ops_quant.SKINNY_DEPTH can pick (policy
// gemm=skinny; not measured yet).
#define QSKINNY_DENSES(T, S)                                                                  \
  QSKINNY_DENSE(T, S, 1, 1) QSKINNY_DENSE(T, S, 2, 1) QSKINNY_DENSE(T, S, 4, 1)               \
  QSKINNY_DENSE(T, S, 1, 2) QSKINNY_DENSE(T, S, 2, 2) QSKINNY_DENSE(T, S, 4, 2)
// The depths ops_quant.SKINNY_DEPTH picks.
#define QSKINNYS(T, S)                                                                        \
  QSKINNY_FP8(T, S, 1, 1) QSKINNY_FP8(T, S, 2, 1) QSKINNY_FP8(T, S, 4, 1)                     \
  QSKINNY_FP8(T, S, 8, 1) QSKINNY_FP4(T, S, 1, 3) QSKINNY_FP4(T, S, 2, 3)                     \
  QSKINNY_FP4(T, S, 4, 1) QSKINNY_FP4(T, S, 8, 1) QSKINNY_NORM_FP8(T, S, 1)                  \
  QSKINNY_NORM_FP4(T, S, 3)
#if ATLAS_MMA
INSTANTIATE(QSKINNYS)
INSTANTIATE(QSKINNY_DENSES)
#endif
