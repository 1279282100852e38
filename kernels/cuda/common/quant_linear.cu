// Quantized linears (atlas_core/ops/quant.py formats): y[M, N] = x[M, K] @ dequant(W)^T (+ bias)
// with W8A16 (fp8 e4m3 codes, f32 tensor / channel / block scales) or W4A16 (NVFP4: packed e2m1
// pairs, e4m3 scales per 16 elements, an f32 global scale). Activations stay in T.
//   qgemv_{fp8,nvfp4}_*_m{MT}   at most MT rows of x (1, 2, 4, 8): each warp streams whole weight
//                               rows with 16-byte loads (16 fp8 / 32 e2m1 values a lane),
//                               dequantizes in registers and multiplies every row of the tile, so
//                               a launch reads each weight byte once. S warps (runtime 1/2/4/8)
//                               split K of one column and sum through shared memory.
//   qdequant_{fp8,nvfp4}_*      the dequantized weight in T (prefill: the dense GEMM reads it).
//   qdequant16_fp8_* / qdequant32_nvfp4_*  the same, one 16-byte load of codes a thread
//                               (K a multiple of 16 / 32, FP8 blocks 16 wide): the prefill path.
//   qfill_fp8 / qfill_bytes     random codes for benchmark weights, filled on the device.
// Scale index of element (e, n, k) for fp8: e * s_lead + (n / bn) * s_row + k / bk (decoders
// and scales: quant_common.cuh).
#include "common.cuh"
#include "quant_common.cuh"

// U groups of 16-byte loads a lane keeps in flight: the next group loads while this one is used.
// A chunk's scale multiplies each group's partial sum (one multiply per 16 products).
template <typename T, int FMT, int MT>
__device__ void qgemv_impl(T* __restrict__ y, const T* __restrict__ x,
                           const unsigned char* __restrict__ w, QScale q,
                           const T* __restrict__ bias, int M, int N, int K, int m0, int S) {
  constexpr int E = QChunk<FMT>::ELEMS, U = 4, GROUPS = E / 16;
  __shared__ float red[8 * MT];
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int part = warp % S, n = blockIdx.x * (8 / S) + warp / S;
  bool live = n < N;
  int nn = live ? n : N - 1;
  long long row_bytes = K / QChunk<FMT>::BYTES_PER_ROW_DIV;
  const unsigned char* wr = w + (long long)nn * row_bytes;
  int chunks = K / E, step = 32 * S;
  uint4 cur[U];
  int c0 = part * 32 + lane;
#pragma unroll
  for (int u = 0; u < U; u++)
    if (c0 + u * step < chunks)
      cur[u] = *reinterpret_cast<const uint4*>(wr + (long long)(c0 + u * step) * 16);
  pdl_trigger();
  pdl_wait();
  float g = FMT == 1 ? q.gscale[0] : 1.f;
  float acc[MT];
#pragma unroll
  for (int m = 0; m < MT; m++) acc[m] = 0.f;
  const T* xb = x + (long long)m0 * K;
  for (int c = c0; c < chunks; c += U * step) {
    uint4 nxt[U];
#pragma unroll
    for (int u = 0; u < U; u++) {
      int cn = c + (U + u) * step;
      if (cn < chunks) nxt[u] = *reinterpret_cast<const uint4*>(wr + (long long)cn * 16);
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
      int cc = c + u * step;
      if (cc >= chunks) break;
      int k = cc * E;
      float wf[E], s[GROUPS];
      QChunk<FMT>::decode(cur[u], wf);
      QChunk<FMT>::scales(q, nn, k, K, g, s);
#pragma unroll
      for (int m = 0; m < MT; m++) {
        if (m0 + m < M) {
          const T* xr = xb + (long long)m * K + k;
#pragma unroll
          for (int gi = 0; gi < GROUPS; gi++) {
            float part = 0.f;
#pragma unroll
            for (int h = 0; h < 2; h++) {
              float xf[8]; Vec8<T> xv; xv.load(xr + 16 * gi + 8 * h); xv.to_float(xf);
#pragma unroll
              for (int j = 0; j < 8; j++) part += wf[16 * gi + 8 * h + j] * xf[j];
            }
            acc[m] += s[gi] * part;
          }
        }
      }
    }
#pragma unroll
    for (int u = 0; u < U; u++) cur[u] = nxt[u];
  }
#pragma unroll
  for (int m = 0; m < MT; m++) acc[m] = warp_sum(acc[m]);
  if (S > 1) {
    if (lane == 0)
#pragma unroll
      for (int m = 0; m < MT; m++) red[warp * MT + m] = acc[m];
    __syncthreads();
    if (part) return;
    for (int p = 1; p < S; p++)
#pragma unroll
      for (int m = 0; m < MT; m++) acc[m] += red[(warp + p) * MT + m];
  }
  if (lane || !live) return;
  float b = bias ? to_f32(bias[n]) : 0.f;
#pragma unroll
  for (int m = 0; m < MT; m++)
    if (m0 + m < M) y[(long long)(m0 + m) * N + n] = from_f32<T>(acc[m] + b);
}

// out[e, n, k] = dequant(W)[e, n, k] for L * N rows of K (one thread per element / byte).
template <typename T>
__device__ void qdequant_fp8_impl(T* out, const unsigned char* w, const float* scale, int N,
                                  int K, int bn, int bk, int s_row, long long s_lead,
                                  long long total) {
  long long stride = (long long)gridDim.x * blockDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
    long long row = i / K;
    int k = (int)(i - row * K), n = (int)(row % N);
    long long e = row / N;
    float s = scale[e * s_lead + (long long)(n / bn) * s_row + k / bk];
    fp8 c; c.x = w[i];
    out[i] = from_f32<T>(to_f32(c) * s);
  }
}
template <typename T>
__device__ void qdequant_nvfp4_impl(T* out, const unsigned char* w, const unsigned char* scale,
                                    const float* gscale, int N, int K, long long total_bytes) {
  long long stride = (long long)gridDim.x * blockDim.x;
  int half_k = K / 2;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total_bytes;
       i += stride) {
    long long row = i / half_k;
    int j = (int)(i - row * half_k);
    fp8 sc; sc.x = scale[row * (K / 16) + (2 * j) / 16];
    float s = to_f32(sc) * gscale[row / N] * 16384.f, lo, hi;
    half2_to_float2(e2m1x2_bits(w[i]), lo, hi);
    out[row * K + 2 * j] = from_f32<T>(lo * s);
    out[row * K + 2 * j + 1] = from_f32<T>(hi * s);
  }
}

// The same, 16 fp8 codes (one 16-byte load) a thread: K and bk multiples of 16, so a chunk has
// one scale. Codes decode exactly with integer ops (quant_common.cuh), then multiply the f32
// scale and round once, as the reference does.
template <typename T>
__device__ void qdequant16_fp8_impl(T* out, const unsigned char* w, const float* scale, int N,
                                    int K, int bn, int bk, int s_row, long long s_lead,
                                    long long chunks) {
  const u32 fix = QPair<bf16>::pair(QPair<bf16>::fp8_fix());
  long long stride = (long long)gridDim.x * blockDim.x;
  for (long long c = (long long)blockIdx.x * blockDim.x + threadIdx.x; c < chunks; c += stride) {
    long long i = c * 16, row = i / K;
    int k = (int)(i - row * K), n = (int)(row % N);
    float s = scale[(row / N) * s_lead + (long long)(n / bn) * s_row + k / bk];
    uint4 raw = ld_stream(w + i);
    float f[16];
#pragma unroll
    for (int j = 0; j < 4; j++) {
      u32 v = word_of(raw, j);
      u32 ev = QPair<bf16>::mul(fp8_pair<bf16, 0>(v), fix);
      u32 od = QPair<bf16>::mul(fp8_pair<bf16, 1>(v), fix);
      f[4 * j] = __uint_as_float(ev << 16) * s;
      f[4 * j + 1] = __uint_as_float(od << 16) * s;
      f[4 * j + 2] = __uint_as_float(ev & 0xffff0000u) * s;
      f[4 * j + 3] = __uint_as_float(od & 0xffff0000u) * s;
    }
    Vec8<T> a, b;
    a.from_float(f);
    b.from_float(f + 8);
    a.store(out + i);
    b.store(out + i + 8);
  }
}
// 32 e2m1 codes (16 bytes, two groups of 16) a thread.
template <typename T>
__device__ void qdequant32_nvfp4_impl(T* out, const unsigned char* w, const unsigned char* scale,
                                      const float* gscale, int N, int K, long long chunks) {
  const u32 fix = QPair<bf16>::pair(__uint_as_float(253u << 23));  // 2^126
  long long stride = (long long)gridDim.x * blockDim.x;
  for (long long c = (long long)blockIdx.x * blockDim.x + threadIdx.x; c < chunks; c += stride) {
    long long i = c * 32, row = i / K;  // element index
    float g = gscale[row / N];
    fp8 s0, s1;
    s0.x = scale[i / 16];
    s1.x = scale[i / 16 + 1];
    float sc[2] = {to_f32(s0) * g, to_f32(s1) * g};
    uint4 raw = ld_stream(w + i / 2);
    float f[32];
#pragma unroll
    for (int j = 0; j < 4; j++) {
      u32 v = word_of(raw, j);
#pragma unroll
      for (int p = 0; p < 4; p++) {  // codes 8 j + p and 8 j + p + 4
        u32 e = QPair<bf16>::mul(fp4_pair<bf16>(v, p), fix);
        f[8 * j + p] = __uint_as_float(e << 16) * sc[j >> 1];
        f[8 * j + p + 4] = __uint_as_float(e & 0xffff0000u) * sc[j >> 1];
      }
    }
#pragma unroll
    for (int q = 0; q < 4; q++) {
      Vec8<T> o;
      o.from_float(f + 8 * q);
      o.store(out + i + 8 * q);
    }
  }
}

#define QGEMV(T, S, MT)                                                                       \
  extern "C" __global__ void __launch_bounds__(256) qgemv_fp8_##S##_m##MT(                   \
      T* y, const T* x, const unsigned char* w, const float* scale, const T* bias, int M,     \
      int N, int K, int m0, int s, int bn, int bk, int s_row) {                               \
    QScale q{scale, nullptr, bn, bk, s_row};                                                  \
    qgemv_impl<T, 0, MT>(y, x, w, q, bias, M, N, K, m0, s);                                   \
  }                                                                                           \
  extern "C" __global__ void __launch_bounds__(256) qgemv_nvfp4_##S##_m##MT(                 \
      T* y, const T* x, const unsigned char* w, const unsigned char* scale,                   \
      const float* gscale, const T* bias, int M, int N, int K, int m0, int s) {               \
    QScale q{scale, gscale, 1, 16, 0};                                                        \
    qgemv_impl<T, 1, MT>(y, x, w, q, bias, M, N, K, m0, s);                                   \
  }
#define QLINEAR(T, S)                                                                         \
  QGEMV(T, S, 1) QGEMV(T, S, 2) QGEMV(T, S, 4) QGEMV(T, S, 8)                                 \
  extern "C" __global__ void qdequant_fp8_##S(T* out, const unsigned char* w,                 \
                                              const float* scale, int N, int K, int bn,       \
                                              int bk, int s_row, long long s_lead,            \
                                              long long total) {                              \
    qdequant_fp8_impl<T>(out, w, scale, N, K, bn, bk, s_row, s_lead, total);                  \
  }                                                                                           \
  extern "C" __global__ void qdequant_nvfp4_##S(T* out, const unsigned char* w,               \
                                                const unsigned char* scale,                   \
                                                const float* gscale, int N, int K,            \
                                                long long total_bytes) {                      \
    qdequant_nvfp4_impl<T>(out, w, scale, gscale, N, K, total_bytes);                         \
  }                                                                                           \
  extern "C" __global__ void qdequant16_fp8_##S(T* out, const unsigned char* w,               \
                                                const float* scale, int N, int K, int bn,     \
                                                int bk, int s_row, long long s_lead,          \
                                                long long chunks) {                           \
    qdequant16_fp8_impl<T>(out, w, scale, N, K, bn, bk, s_row, s_lead, chunks);               \
  }                                                                                           \
  extern "C" __global__ void qdequant32_nvfp4_##S(T* out, const unsigned char* w,             \
                                                  const unsigned char* scale,                 \
                                                  const float* gscale, int N, int K,          \
                                                  long long chunks) {                         \
    qdequant32_nvfp4_impl<T>(out, w, scale, gscale, N, K, chunks);                            \
  }
INSTANTIATE(QLINEAR)

__device__ __forceinline__ u32 qhash(u64 seed, long long i) {
  u64 z = seed + (u64)(i + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return (u32)((z ^ (z >> 31)) >> 32);
}
// fp8 codes of mean + std * u, u uniform with unit variance (saturating to +-448).
extern "C" __global__ void qfill_fp8(unsigned char* out, long long n, u64 seed, float mean,
                                     float std) {
  long long stride = (long long)gridDim.x * blockDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    float u = ((float)(qhash(seed, i) >> 8) * (1.f / 16777216.f) - 0.5f) * 3.4641016f;
    out[i] = from_f32<fp8>(mean + std * u).x;
  }
}
// Uniform random bytes (NVFP4 data: every pair of e2m1 codes equally likely).
extern "C" __global__ void qfill_bytes(unsigned char* out, long long n, u64 seed) {
  long long stride = (long long)gridDim.x * blockDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = (unsigned char)(qhash(seed, i) >> 24);
}
