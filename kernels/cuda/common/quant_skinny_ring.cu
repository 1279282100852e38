// Quantized linears for decode batches on the tensor cores, shared-memory ring (W8A16 / W4A16,
// and dense weights in the activation dtype, FMT 2):
//   qskinny2_{fp8,nvfp4}[_norm]_*_n{NT}_m{MT}_d{D}   y[M, N] = x[M, K] @ dequant(W)^T (+ bias)
//   qskinny2_dense_*_n{NT}_m{MT}_d{D}                 y = x @ W^T (+ bias)
// The decode and MMA layout of quant_skinny.cu (read its header), with the weights streamed
// by cp.async and MT weight tiles a warp; ops_quant.SKINNY2_CONFIG says which (format, NT)
// take these kernels (measured per configuration: scripts/quant_skinny_bench.py --sweep).
#include "common.cuh"
#include "mma.cuh"
#include "quant_common.cuh"
#include "norm_rows.cuh"
#include "quant_skinny.cuh"


// qskinny2: the same decode and MMAs, but each lane streams its weight chunks through a private
// ring of D steps in shared memory with cp.async (a lane reads back only what it copied, so
// cp.async.wait_group is all the ordering it needs: no barriers in the loop); the registers the
// register ring took go to MT weight tiles a warp (16 MT rows), which share every x fragment.
// Dynamic shared memory: max(8 warps x D x 2 MT V x 512 B, the K-split reduction when S > 1).
template <typename T, int FMT, int NT, int MT, int D, bool NORM = false>
__device__ void qskinny2_impl(T* __restrict__ y, const T* x,
                              const unsigned char* __restrict__ w, QScale q,
                              const T* __restrict__ bias, int M, int N, int K, int S,
                              QNorm nq = QNorm{}) {
  using P = QPair<T>;
  constexpr int V = FMT == 0 ? 2 : FMT == 1 ? 1 : 4;  // 16-byte chunks of one row a step
  constexpr int CH = MT * 2 * V;       // chunks a lane copies a step
  extern __shared__ uint4 qs_ring[];
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int t = lane & 3, g = lane >> 2;
  int part = warp % S, n0 = (blockIdx.x * (8 / S) + warp / S) * 16 * MT;
  uint4* ring = qs_ring + warp * D * CH * 32 + lane;  // slot u, chunk c: ring[(u CH + c) 32]
  int rows[MT][2];
  const unsigned char* wr[MT][2];
  long long row_bytes = FMT == 0 ? K : FMT == 1 ? K / 2 : (long long)K * sizeof(T);
#pragma unroll
  for (int m = 0; m < MT; m++)
#pragma unroll
    for (int r = 0; r < 2; r++) {
      rows[m][r] = min(n0 + 16 * m + g + 8 * r, N - 1);
      wr[m][r] = w + (long long)rows[m][r] * row_bytes + qchunk_offset(t, 0);
    }
  int steps = n0 < N ? K / 128 : 0;
  int mine = steps > part ? (steps - part + S - 1) / S : 0;  // this warp's steps
  auto issue = [&](int i) {  // copy step part + i S into slot i % D (one commit group always)
    if (i < mine) {
      long long off = (long long)(part + i * S) * 64 * V;
      uint4* slot = ring + (i % D) * CH * 32;
#pragma unroll
      for (int m = 0; m < MT; m++)
#pragma unroll
        for (int r = 0; r < 2; r++)
#pragma unroll
          for (int v = 0; v < V; v++)
            cp_async16(slot + ((m * 2 + r) * V + v) * 32, wr[m][r] + off + 64 * v, true);
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory");
  };
#pragma unroll
  for (int i = 0; i < D - 1; i++) issue(i);
  pdl_trigger();
  pdl_wait();
  if constexpr (NORM) {  // the normed rows after the 8 rings
    T* xs = reinterpret_cast<T*>(qs_ring + 8 * D * CH * 32);
    norm_rows_to_shared<T, 8>(xs, reinterpret_cast<T*>(nq.r_out), nullptr, x,
                              reinterpret_cast<const T*>(nq.residual),
                              reinterpret_cast<const T*>(nq.nw), nq.eps, nq.zc, M, K, 0);
    x = xs;
  }
  float acc[MT][NT][4];
#pragma unroll
  for (int m = 0; m < MT; m++)
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
      for (int c = 0; c < 4; c++) acc[m][j][c] = 0.f;
  const float* srow[MT][2];
  float inv_steps = 0.f;
  if constexpr (FMT == 0) {
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
      for (int r = 0; r < 2; r++)
        srow[m][r] = reinterpret_cast<const float*>(q.scale) + (rows[m][r] / q.bn) * q.s_row;
    inv_steps = q.bk >= K ? 0.f : 128.f / (float)q.bk;
  }
  for (int i = 0; i < mine; i++) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(D - 2) : "memory");
    int s = part + i * S, k0 = s * 128, k = k0 + 32 * t;
    uint4 xv[2][4];
    qx_load<T, FMT>(xv[0], x, g, M, K, k0, t);
    u32 a[MT][8][4];
    float fs[MT][2];
    const uint4* slot = ring + (i % D) * CH * 32;
#pragma unroll
    for (int m = 0; m < MT; m++) {
      uint4 buf[2][V];
#pragma unroll
      for (int r = 0; r < 2; r++)
#pragma unroll
        for (int v = 0; v < V; v++) buf[r][v] = slot[((m * 2 + r) * V + v) * 32];
      if constexpr (FMT == 2) {
        qdecode_dense(buf, a[m]);
      } else if constexpr (FMT == 0) {
        int blk = (int)(((float)s + 0.5f) * inv_steps);
#pragma unroll
        for (int r = 0; r < 2; r++) fs[m][r] = srow[m][r][blk];
        qdecode_fp8<T>(buf, a[m]);
      } else {
        u32 sc[2];
#pragma unroll
        for (int r = 0; r < 2; r++)
          sc[r] = *reinterpret_cast<const unsigned short*>(
              reinterpret_cast<const unsigned char*>(q.scale) +
              (long long)rows[m][r] * (K / 16) + k / 16);
        qdecode_nvfp4<T>(buf, sc, a[m]);
      }
    }
    issue(i + D - 1);  // into the slot read last step
#pragma unroll
    for (int j = 0; j < NT; j++) {
      if (j + 1 < NT) qx_load<T, FMT>(xv[(j + 1) & 1], x, 8 * (j + 1) + g, M, K, k0, t);
      u32 b[8][2];
#pragma unroll
      for (int st = 0; st < 8; st++) qx_frag<FMT>(xv[j & 1], st, b[st]);
#pragma unroll
      for (int m = 0; m < MT; m++) {
        if constexpr (FMT == 0) {
          float c[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
          for (int st = 0; st < 8; st++) mma16816<T>(c, a[m][st], b[st]);
          acc[m][j][0] += fs[m][0] * c[0];
          acc[m][j][1] += fs[m][0] * c[1];
          acc[m][j][2] += fs[m][1] * c[2];
          acc[m][j][3] += fs[m][1] * c[3];
        } else {
#pragma unroll
          for (int st = 0; st < 8; st++) mma16816<T>(acc[m][j], a[m][st], b[st]);
        }
      }
    }
  }
  if (S > 1) {
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
    __syncthreads();  // every warp is done with its ring: the reduction reuses it
    float* red = reinterpret_cast<float*>(qs_ring);  // [8 warps][MT][NT][4][32]
    constexpr int PER = MT * NT * 4 * 32;
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
      for (int j = 0; j < NT; j++)
#pragma unroll
        for (int c = 0; c < 4; c++) red[warp * PER + ((m * NT + j) * 4 + c) * 32 + lane] = acc[m][j][c];
    __syncthreads();
    if (part) return;
    for (int p = 1; p < S; p++)
#pragma unroll
      for (int m = 0; m < MT; m++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
          for (int c = 0; c < 4; c++)
            acc[m][j][c] += red[(warp + p) * PER + ((m * NT + j) * 4 + c) * 32 + lane];
  }
  float out = FMT == 1 ? q.gscale[0] * P::fp4_out() : 1.f;
#pragma unroll
  for (int m = 0; m < MT; m++)
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
      for (int c = 0; c < 4; c++) {
        int row = 8 * j + 2 * t + (c & 1), n = n0 + 16 * m + g + 8 * (c >> 1);
        if (row < M && n < N)
          y[(long long)row * N + n] =
              from_f32<T>(acc[m][j][c] * out + (bias ? to_f32(bias[n]) : 0.f));
      }
}

#define QSKINNY2_FP8(T, S, NT, MT, D)                                                         \
  extern "C" __global__ void __launch_bounds__(256) qskinny2_fp8_##S##_n##NT##_m##MT##_d##D( \
      T* y, const T* x, const unsigned char* w, const float* scale, const T* bias, int M,     \
      int N, int K, int s, int bn, int bk, int s_row) {                                       \
    QScale q{scale, nullptr, bn, bk, s_row};                                                  \
    qskinny2_impl<T, 0, NT, MT, D>(y, x, w, q, bias, M, N, K, s);                             \
  }
#define QSKINNY2_NORM_FP8(T, S, MT, D)                                                        \
  extern "C" __global__ void __launch_bounds__(256) qskinny2_norm_fp8_##S##_n1_m##MT##_d##D( \
      T* y, const T* x, const unsigned char* w, const float* scale, const T* bias, int M,     \
      int N, int K, int s, int bn, int bk, int s_row, QNORM_ARGS(T)) {                           \
    QScale q{scale, nullptr, bn, bk, s_row};                                                  \
    qskinny2_impl<T, 0, 1, MT, D, true>(y, x, w, q, bias, M, N, K, s,                         \
                                        QNorm{r_out, residual, nw, eps, zc});                 \
  }
#define QSKINNY2_NORM_FP4(T, S, MT, D)                                                        \
  extern "C" __global__ void __launch_bounds__(256) qskinny2_norm_nvfp4_##S##_n1_m##MT##_d##D( \
      T* y, const T* x, const unsigned char* w, const unsigned char* scale,                   \
      const float* gscale, const T* bias, int M, int N, int K, int s, QNORM_ARGS(T)) {          \
    QScale q{scale, gscale, 1, 16, 0};                                                        \
    qskinny2_impl<T, 1, 1, MT, D, true>(y, x, w, q, bias, M, N, K, s,                         \
                                        QNorm{r_out, residual, nw, eps, zc});                 \
  }
#define QSKINNY2_FP4(T, S, NT, MT, D)                                                         \
  extern "C" __global__ void __launch_bounds__(256) qskinny2_nvfp4_##S##_n##NT##_m##MT##_d##D( \
      T* y, const T* x, const unsigned char* w, const unsigned char* scale,                   \
      const float* gscale, const T* bias, int M, int N, int K, int s) {                       \
    QScale q{scale, gscale, 1, 16, 0};                                                        \
    qskinny2_impl<T, 1, NT, MT, D>(y, x, w, q, bias, M, N, K, s);                             \
  }
// Weights in the activation dtype (qskinny_dense's ring form; policy gemm=skinny with an
// ops_quant.SKINNY2_CONFIG "dense" entry; not measured yet).
#define QSKINNY2_DENSE(T, S, NT, MT, D)                                                       \
  extern "C" __global__ void __launch_bounds__(256) qskinny2_dense_##S##_n##NT##_m##MT##_d##D( \
      T* y, const T* x, const unsigned char* w, const T* bias, int M, int N, int K, int s) {  \
    QScale q{nullptr, nullptr, 1, 1, 0};                                                      \
    qskinny2_impl<T, 2, NT, MT, D>(y, x, w, q, bias, M, N, K, s);                             \
  }
#define QSKINNY2_DENSES(T, S)                                                                 \
  QSKINNY2_DENSE(T, S, 1, 1, 3) QSKINNY2_DENSE(T, S, 2, 1, 3) QSKINNY2_DENSE(T, S, 4, 1, 3)   \
  QSKINNY2_DENSE(T, S, 1, 1, 4) QSKINNY2_DENSE(T, S, 2, 1, 4) QSKINNY2_DENSE(T, S, 4, 1, 4)
// The sweep (scripts/quant_skinny_bench.py --sweep builds with QSKINNY_SWEEP): every n-tile
// count with MT 1-2 and depths 3-8; the default build: the configurations ops_quant picks.
#define QSKINNY2_BOTH(T, S, NT, MT, D) QSKINNY2_FP8(T, S, NT, MT, D) QSKINNY2_FP4(T, S, NT, MT, D)
#define QSKINNY2_DEPTHS(T, S, NT, MT)                                                         \
  QSKINNY2_BOTH(T, S, NT, MT, 3) QSKINNY2_BOTH(T, S, NT, MT, 4)                               \
  QSKINNY2_BOTH(T, S, NT, MT, 6) QSKINNY2_BOTH(T, S, NT, MT, 8)
#define QSKINNY2_SWEEP(T, S)                                                                  \
  QSKINNY2_DEPTHS(T, S, 1, 1) QSKINNY2_DEPTHS(T, S, 1, 2) QSKINNY2_DEPTHS(T, S, 2, 1)         \
  QSKINNY2_DEPTHS(T, S, 2, 2) QSKINNY2_DEPTHS(T, S, 4, 1) QSKINNY2_DEPTHS(T, S, 4, 2)         \
  QSKINNY2_DEPTHS(T, S, 8, 1) QSKINNY2_DEPTHS(T, S, 8, 2)
// ops_quant.SKINNY2_CONFIG, (format, NT) -> (MT, D).
#define QSKINNY2_DEFAULT(T, S)                                                                \
  QSKINNY2_FP8(T, S, 1, 1, 3) QSKINNY2_FP8(T, S, 8, 2, 3) QSKINNY2_FP4(T, S, 2, 2, 4)        \
  QSKINNY2_FP4(T, S, 4, 2, 4) QSKINNY2_FP4(T, S, 8, 2, 4)
// The rms_norm_linear kernels of the one-n-tile entries (1-8 rows).
#define QSKINNY2_NORMS(T, S) QSKINNY2_NORM_FP8(T, S, 1, 3)
#if ATLAS_MMA && defined(QSKINNY_SWEEP)
INSTANTIATE(QSKINNY2_SWEEP)
#elif ATLAS_MMA
INSTANTIATE(QSKINNY2_DEFAULT)
#endif
#if ATLAS_MMA
INSTANTIATE(QSKINNY2_NORMS)
INSTANTIATE(QSKINNY2_DENSES)
#endif
