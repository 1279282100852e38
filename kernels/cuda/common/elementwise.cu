// Embedding gather, RMSNorm (+ fused residual add), add, gated activations. Every kernel may be
// launched with PDL: it lets the next kernel launch, then waits for the previous one's writes.
#include "common.cuh"

// One block per row; hidden must be a multiple of 8 (every model dim is).
template <typename T>
__device__ void embedding_impl(T* out, const int* ids, const T* table, int hidden) {
  pdl_trigger();
  pdl_wait();
  const T* src = table + (long long)ids[blockIdx.x] * hidden;
  T* dst = out + (long long)blockIdx.x * hidden;
  for (int i = threadIdx.x * 8; i < hidden; i += blockDim.x * 8) {
    Vec8<T> v; v.load(src + i); v.store(dst + i);
  }
}

// y = x * rsqrt(mean(x^2) + eps) * w; with residual: x += residual first and store it.
// The row is kept in registers: hidden <= blockDim.x * 8 * MAXV.
template <typename T, int MAXV>
__device__ void rms_norm_impl(T* y, T* r_out, const T* x, const T* residual, const T* w,
                              float eps, int hidden, int zero_centered) {
  __shared__ float scratch[32];
  pdl_trigger();
  pdl_wait();
  long long row = (long long)blockIdx.x * hidden;
  float v[MAXV][8];
  float ss = 0.f;
#pragma unroll
  for (int j = 0; j < MAXV; j++) {
    int i = (threadIdx.x + j * blockDim.x) * 8;
    if (i < hidden) {
      Vec8<T> a; a.load(x + row + i); a.to_float(v[j]);
      if (residual) {
        float b[8]; Vec8<T> bv; bv.load(residual + row + i); bv.to_float(b);
#pragma unroll
        for (int k = 0; k < 8; k++) v[j][k] = to_f32(from_f32<T>(v[j][k] + b[k]));
        Vec8<T> o; o.from_float(v[j]); o.store(r_out + row + i);
      }
#pragma unroll
      for (int k = 0; k < 8; k++) ss += v[j][k] * v[j][k];
    }
  }
  float inv = rsqrtf(block_sum(ss, scratch) / hidden + eps);
#pragma unroll
  for (int j = 0; j < MAXV; j++) {
    int i = (threadIdx.x + j * blockDim.x) * 8;
    if (i < hidden) {
      float wf[8]; Vec8<T> wv; wv.load(w + i); wv.to_float(wf);
#pragma unroll
      for (int k = 0; k < 8; k++) v[j][k] = v[j][k] * inv * (zero_centered ? wf[k] + 1.f : wf[k]);
      Vec8<T> o; o.from_float(v[j]); o.store(y + row + i);
    }
  }
}

// Scalar gather for rows that are not 16-byte multiples (e.g. one logprob per row).
template <typename T>
__device__ void embedding_scalar_impl(T* out, const int* ids, const T* table, int hidden) {
  pdl_trigger();
  pdl_wait();
  const T* src = table + (long long)ids[blockIdx.x] * hidden;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) out[(long long)blockIdx.x * hidden + i] = src[i];
}

// out = a + b in float32, stored as A (b may be narrower: widening add of logits).
template <typename A, typename B>
__device__ void add_impl(A* out, const A* a, const B* b, long long n) {
  pdl_trigger();
  pdl_wait();
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x)
    out[i] = from_f32<A>(to_f32(a[i]) + to_f32(b[i]));
}


template <typename T, int GELU>
__device__ void act_and_mul_scalar_impl(T* out, const T* x, int d, long long n) {
  pdl_trigger();
  pdl_wait();
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x) {
    long long t = i / d, j = i % d;
    float g = to_f32(x[t * 2 * d + j]), u = to_f32(x[t * 2 * d + d + j]);
    out[i] = from_f32<T>((GELU ? gelu_tanh(g) : silu(g)) * u);
  }
}

// out[t, :d] = act(x[t, :d]) * x[t, d:]; grid (ceil(d / (8 * blockDim)), num_tokens).
template <typename T, int GELU>
__device__ void act_and_mul_impl(T* out, const T* x, int d) {
  pdl_trigger();
  pdl_wait();
  int i = (blockIdx.x * blockDim.x + threadIdx.x) * 8;
  if (i >= d) return;
  const T* row = x + (long long)blockIdx.y * 2 * d;
  float g[8], u[8];
  Vec8<T> vg, vu; vg.load(row + i); vu.load(row + d + i); vg.to_float(g); vu.to_float(u);
#pragma unroll
  for (int k = 0; k < 8; k++) g[k] = (GELU ? gelu_tanh(g[k]) : silu(g[k])) * u[k];
  vg.from_float(g); vg.store(out + (long long)blockIdx.y * d + i);
}

#define ELEMENTWISE(T, S)                                                                     \
  extern "C" __global__ void embedding_##S(T* out, const int* ids, const T* table, int h) {  \
    embedding_impl<T>(out, ids, table, h);                                                    \
  }                                                                                           \
  extern "C" __global__ void __launch_bounds__(512) rms_norm_##S(                             \
      T* y, T* r, const T* x, const T* res, const T* w, float eps, int h, int zc) {           \
    rms_norm_impl<T, 4>(y, r, x, res, w, eps, h, zc);                                         \
  }                                                                                           \
  extern "C" __global__ void embedding_scalar_##S(T* out, const int* ids, const T* table,     \
                                                  int h) {                                    \
    embedding_scalar_impl<T>(out, ids, table, h);                                             \
  }                                                                                           \
  extern "C" __global__ void add_##S(T* out, const T* a, const T* b, long long n) {           \
    add_impl<T, T>(out, a, b, n);                                                             \
  }                                                                                           \
  extern "C" __global__ void add_f32_##S(float* out, const float* a, const T* b, long long n) {\
    add_impl<float, T>(out, a, b, n);                                                         \
  }                                                                                           \
  extern "C" __global__ void to_f32_##S(float* out, const T* x, long long n) {                \
    pdl_trigger();                                                                            \
    pdl_wait();                                                                               \
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;               \
         i += (long long)gridDim.x * blockDim.x) out[i] = to_f32(x[i]);                       \
  }                                                                                           \
  extern "C" __global__ void silu_and_mul_##S(T* out, const T* x, int d) {                    \
    act_and_mul_impl<T, 0>(out, x, d);                                                        \
  }                                                                                           \
  extern "C" __global__ void silu_and_mul_scalar_##S(T* out, const T* x, int d, long long n) { \
    act_and_mul_scalar_impl<T, 0>(out, x, d, n);                                              \
  }                                                                                           \
  extern "C" __global__ void gelu_tanh_and_mul_scalar_##S(T* out, const T* x, int d,          \
                                                          long long n) {                      \
    act_and_mul_scalar_impl<T, 1>(out, x, d, n);                                              \
  }                                                                                           \
  extern "C" __global__ void gelu_tanh_and_mul_##S(T* out, const T* x, int d) {               \
    act_and_mul_impl<T, 1>(out, x, d);                                                        \
  }
INSTANTIATE(ELEMENTWISE)
