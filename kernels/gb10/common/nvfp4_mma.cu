// NVFP4 x NVFP4 GEMM on GB10's block-scaled FP4 tensor cores (sm_121a only; plain sm_121 builds
// get kernels that trap, so the module still compiles for every target):
//   mma.sync.aligned.m16n8k64.row.col.kind::mxf4nvf4.block_scale.scale_vec::4X
//       .f32.e2m1.e2m1.f32.ue4m3
// Compile-checked, not run (docs/quantization.md). The layouts below are written once more in
// atlas_gb10/nvfp4_layout.py, whose NumPy emulation of this tile the host tests check.
//   nvfp4_act_quant_*  x[M, K] (T) -> packed e2m1 [M, K/2], ue4m3 group scales in the swizzled
//                      layout, f32 row scales: row r's groups scale to amax / 6 under the row's
//                      amax / (6 * 448), so no group scale leaves the ue4m3 range.
//   nvfp4_gemm_*       y[M, N] = (xq @ wq^T) * xg[m] * wg (+ bias), a warp per 16 x 8 tile.
//   nvfp4_swizzle_scales  a weight's group scales into the MMA's layout (once per weight).
// Operands, in 32-bit words (eight e2m1 codes, low nibble first = ModelOpt's packing):
//   A (x) word (row, k / 8) of xq, B (w) word (n, k / 8) of the checkpoint's weight bytes.
//   lane = 4 * g + t: a0 = A[g][8s + t], a1 = A[g + 8][8s + t], a2 = A[g][8s + t + 4],
//   a3 = A[g + 8][8s + t + 4]; b0 = B[g][8s + t], b1 = B[g][8s + t + 4] for K slab s (64).
//   Scales (byte-id 0, thread-id 0): lane's A word holds the four group scales of row
//   g + 8 * (t & 1), its B word those of column g, slab s: word (s, row) of the swizzled scale
//   array [K / 64, rows] (one u32 = scale bytes 4s..4s+3 of the row), so the lanes of a warp
//   read neighbouring words. Accumulators: c0, c1 = (g, 2t), (g, 2t + 1); c2, c3 = row g + 8.
#include "common.cuh"

// NVRTC 13 defines __CUDA_ARCH_SPECIFIC__ (not __CUDA_ARCH_FEAT_SM121_ALL) for sm_121a.
#if defined(__CUDA_ARCH_SPECIFIC__) && __CUDA_ARCH__ >= 1200
#define ATLAS_FP4_MMA 1
#else
#define ATLAS_FP4_MMA 0
#endif

__device__ __forceinline__ void mma_nvfp4(float* c, const u32* a, const u32* b, u32 sa, u32 sb) {
#if ATLAS_FP4_MMA
  unsigned short z = 0;
  asm volatile(
      "mma.sync.aligned.m16n8k64.row.col.kind::mxf4nvf4.block_scale.scale_vec::4X.f32.e2m1."
      "e2m1.f32.ue4m3 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3}, %10, {%11,%12}, "
      "%13, {%14,%15};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "r"(sa), "h"(z),
        "h"(z), "r"(sb), "h"(z), "h"(z));
#else
  __trap();
#endif
}

// e2m1 code of v (round to nearest; ties to the larger magnitude, as the NumPy encoder's argmin
// of the first nearest differs only on exact ties).
__device__ __forceinline__ u32 e2m1_code(float v) {
  float a = fabsf(v);
  u32 m = (a >= 0.25f) + (a >= 0.75f) + (a >= 1.25f) + (a >= 1.75f) + (a >= 2.5f) +
          (a >= 3.5f) + (a >= 5.f);
  return m | (v < 0.f ? 8u : 0u);
}

// One block per row: 256 threads, a thread per group of 16 (K <= 65,536).
template <typename T>
__device__ void act_quant_impl(u32* xq, u32* xs, float* xg, const T* x, int M, int K) {
  __shared__ float scratch[32];
  int r = blockIdx.x, groups = K / 16;
  const T* xr = x + (long long)r * K;
  float amax = 0.f;
  for (int k = threadIdx.x; k < K; k += blockDim.x) amax = fmaxf(amax, fabsf(to_f32(xr[k])));
  amax = block_max(amax, scratch);
  float g = amax > 0.f ? amax / (6.f * 448.f) : 1.f;
  if (threadIdx.x == 0) xg[r] = g;
  unsigned char* sbytes = reinterpret_cast<unsigned char*>(xs);
  for (int gi = threadIdx.x; gi < groups; gi += blockDim.x) {
    float v[16], gmax = 0.f;
#pragma unroll
    for (int j = 0; j < 16; j++) {
      v[j] = to_f32(xr[gi * 16 + j]);
      gmax = fmaxf(gmax, fabsf(v[j]));
    }
    fp8 sc = from_f32<fp8>(gmax / (6.f * g));
    float s = to_f32(sc) * g, inv = s > 0.f ? 1.f / s : 0.f;
    u32 w0 = 0, w1 = 0;
#pragma unroll
    for (int j = 0; j < 8; j++) {
      w0 |= e2m1_code(v[j] * inv) << (4 * j);
      w1 |= e2m1_code(v[8 + j] * inv) << (4 * j);
    }
    xq[(long long)r * (K / 8) + 2 * gi] = w0;
    xq[(long long)r * (K / 8) + 2 * gi + 1] = w1;
    sbytes[((long long)(gi / 4) * M + r) * 4 + gi % 4] = sc.x;
  }
}

// Block: 4 warps side by side over N (a 16 x 32 output tile). K a multiple of 64.
template <typename T>
__device__ void gemm_impl(T* y, const u32* xq, const u32* xs, const float* xg, const u32* wq,
                          const u32* ws, const float* wg, const T* bias, int M, int N, int K) {
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  int m0 = blockIdx.y * 16, n0 = blockIdx.x * 32 + warp * 8;
  int kw = K / 8, slabs = K / 64;
  int ra = min(m0 + g, M - 1), rb = min(m0 + g + 8, M - 1), rs = min(m0 + g + 8 * (t & 1), M - 1);
  int n = min(n0 + g, N - 1);
  const u32* a_lo = xq + (long long)ra * kw;
  const u32* a_hi = xq + (long long)rb * kw;
  const u32* b_row = wq + (long long)n * kw;
  float c[4] = {0.f, 0.f, 0.f, 0.f};
  pdl_wait();
  for (int s = 0; s < slabs; s++) {
    u32 a[4] = {a_lo[8 * s + t], a_hi[8 * s + t], a_lo[8 * s + t + 4], a_hi[8 * s + t + 4]};
    u32 b[2] = {b_row[8 * s + t], b_row[8 * s + t + 4]};
    mma_nvfp4(c, a, b, xs[(long long)s * M + rs], ws[(long long)s * N + n]);
  }
  float gw = wg[0];
#pragma unroll
  for (int i = 0; i < 4; i++) {
    int m = m0 + g + 8 * (i >> 1), col = n0 + 2 * t + (i & 1);
    if (m < M && col < N)
      y[(long long)m * N + col] = from_f32<T>(c[i] * xg[m] * gw + (bias ? to_f32(bias[col]) : 0.f));
  }
}

#define NVFP4_MMA(T, S)                                                                       \
  extern "C" __global__ void __launch_bounds__(256) nvfp4_act_quant_##S(                     \
      u32* xq, u32* xs, float* xg, const T* x, int M, int K) {                                \
    act_quant_impl<T>(xq, xs, xg, x, M, K);                                                   \
  }                                                                                           \
  extern "C" __global__ void __launch_bounds__(128) nvfp4_gemm_##S(                          \
      T* y, const u32* xq, const u32* xs, const float* xg, const u32* wq, const u32* ws,      \
      const float* wg, const T* bias, int M, int N, int K) {                                  \
    gemm_impl<T>(y, xq, xs, xg, wq, ws, wg, bias, M, N, K);                                   \
  }
INSTANTIATE(NVFP4_MMA)

// The checkpoint's row-major ue4m3 scales [rows, K/16] -> the MMA's u32 [K/64, rows] (word
// (s, r) = scale bytes 4s..4s+3 of row r), once per weight.
extern "C" __global__ void nvfp4_swizzle_scales(u32* out, const unsigned char* scale, int rows,
                                                int groups) {
  long long total = (long long)rows * (groups / 4), stride = (long long)gridDim.x * blockDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
    long long s = i / rows, r = i % rows;
    const unsigned char* p = scale + r * groups + 4 * s;
    out[i] = (u32)p[0] | ((u32)p[1] << 8) | ((u32)p[2] << 16) | ((u32)p[3] << 24);
  }
}
