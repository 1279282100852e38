// atlas-gemma4: mul, softcap, mul_gathered (grid-stride loops: each touches a row of hidden
// states or logits per token, a sliver of a step) and ffn_out (a block per row); references in
// atlas_gemma4.ops. Float32 math, stored in the first operand's dtype, rounded where the
// references round.
#include "common.cuh"

// How b broadcasts against a (n elements, last dimension d): one value, one per column
// (b: [d]), one per row (b: [..., 1]) or one per element.
#define MUL_SCALAR 0
#define MUL_ROW 1
#define MUL_COLUMN 2
#define MUL_FULL 3

template <typename A, typename B>
__device__ void mul_impl(A* out, const A* a, const B* b, int mode, int d, long long n) {
  pdl_trigger();  // both kernels may be launched with PDL
  pdl_wait();
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x) {
    long long j = mode == MUL_SCALAR ? 0 : mode == MUL_ROW ? i % d : mode == MUL_COLUMN ? i / d : i;
    out[i] = from_f32<A>(to_f32(a[i]) * to_f32(b[j]));
  }
}

template <typename T>
__device__ void softcap_impl(T* out, const T* x, float cap, long long n) {
  pdl_trigger();
  pdl_wait();
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x)
    out[i] = from_f32<T>(cap * tanhf(to_f32(x[i]) / cap));
}

// out = a * table[ids] (a: float32 top-k weights, table: a stored per-expert scale).
template <typename T>
__device__ void mul_gathered_impl(float* out, const float* a, const int* ids, const T* table,
                                  long long n) {
  pdl_trigger();
  pdl_wait();
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x)
    out[i] = a[i] * to_f32(table[ids[i]]);
}

// A norm weight slice as float (w + 1 when stored zero-centred), zeros past the row.
template <typename T>
__device__ __forceinline__ void ffn_weight(float* f, const T* w, int i, int d, int zc) {
  if (!w || i >= d) {
#pragma unroll
    for (int k = 0; k < 8; k++) f[k] = 0.f;
    return;
  }
  Vec8<T> v;
  v.load(w + i);
  v.to_float(f);
#pragma unroll
  for (int k = 0; k < 8; k++) f[k] += zc ? 1.f : 0.f;
}

// x[k] <- round(x[k] * inv * w[k]) (the normed row as rms_norm stores it).
template <typename T>
__device__ __forceinline__ void ffn_normed(float* x, float inv, const float* w) {
#pragma unroll
  for (int k = 0; k < 8; k++) x[k] = to_f32(from_f32<T>(x[k] * inv * w[k]));
}

// ffn_out (reference atlas_gemma4.ops.ffn_out): a block per row, 8 columns a thread in
// MAXV passes of the block; the three norm weights load before the PDL wait (static).
template <typename T, int MAXV>
__device__ void ffn_out_impl(T* out, const T* hidden, const T* ffn, const T* w_ffn,
                             const T* routed, const T* w_routed, const T* w_post,
                             const T* scalar, float eps, int d, int zc) {
  __shared__ float scratch[32];
  float wf[MAXV][8], wr[MAXV][8], wp[MAXV][8];
#pragma unroll
  for (int j = 0; j < MAXV; j++) {
    int i = (threadIdx.x + j * blockDim.x) * 8;
    ffn_weight<T>(wp[j], w_post, i, d, zc);
    ffn_weight<T>(wf[j], routed ? w_ffn : nullptr, i, d, zc);
    ffn_weight<T>(wr[j], routed ? w_routed : nullptr, i, d, zc);
  }
  pdl_trigger();
  pdl_wait();
  long long row = (long long)blockIdx.x * d;
  float f[MAXV][8], r[MAXV][8], h[MAXV][8];
  float sf = 0.f, sr = 0.f;
#pragma unroll
  for (int j = 0; j < MAXV; j++) {
    int i = (threadIdx.x + j * blockDim.x) * 8;
#pragma unroll
    for (int k = 0; k < 8; k++) { f[j][k] = 0.f; r[j][k] = 0.f; h[j][k] = 0.f; }
    if (i < d) {
      Vec8<T> v;
      v.load(ffn + row + i); v.to_float(f[j]);
      v.load(hidden + row + i); v.to_float(h[j]);
      if (routed) { v.load(routed + row + i); v.to_float(r[j]); }
    }
#pragma unroll
    for (int k = 0; k < 8; k++) { sf += f[j][k] * f[j][k]; sr += r[j][k] * r[j][k]; }
  }
  if (routed) {
    float inv_f = rsqrtf(block_sum(sf, scratch) / d + eps);
    float inv_r = rsqrtf(block_sum(sr, scratch) / d + eps);
    sf = 0.f;
#pragma unroll
    for (int j = 0; j < MAXV; j++) {
      ffn_normed<T>(f[j], inv_f, wf[j]);
      ffn_normed<T>(r[j], inv_r, wr[j]);
#pragma unroll
      for (int k = 0; k < 8; k++) {
        f[j][k] = to_f32(from_f32<T>(f[j][k] + r[j][k]));
        sf += f[j][k] * f[j][k];
      }
    }
  }
  float inv = rsqrtf(block_sum(sf, scratch) / d + eps);
  float sc = scalar ? to_f32(scalar[0]) : 1.f;
#pragma unroll
  for (int j = 0; j < MAXV; j++) {
    int i = (threadIdx.x + j * blockDim.x) * 8;
    if (i >= d) continue;
    ffn_normed<T>(f[j], inv, wp[j]);
    float o[8];
#pragma unroll
    for (int k = 0; k < 8; k++) {
      o[k] = to_f32(from_f32<T>(h[j][k] + f[j][k]));
      if (scalar) o[k] *= sc;
    }
    Vec8<T> v;
    v.from_float(o);
    v.store(out + row + i);
  }
}

#define GEMMA4_ELEMENTWISE(T, S)                                                              \
  extern "C" __global__ void g4_mul_##S(T* out, const T* a, const T* b, int mode, int d,      \
                                        long long n) {                                        \
    mul_impl<T, T>(out, a, b, mode, d, n);                                                    \
  }                                                                                           \
  extern "C" __global__ void g4_mul_wf32_##S(T* out, const T* a, const float* b, int mode,    \
                                             int d, long long n) {                            \
    mul_impl<T, float>(out, a, b, mode, d, n);                                                \
  }                                                                                           \
  extern "C" __global__ void g4_softcap_##S(T* out, const T* x, float cap, long long n) {     \
    softcap_impl<T>(out, x, cap, n);                                                          \
  }                                                                                           \
  extern "C" __global__ void g4_mul_gathered_##S(float* out, const float* a, const int* ids,  \
                                                 const T* table, long long n) {               \
    mul_gathered_impl<T>(out, a, ids, table, n);                                              \
  }                                                                                           \
  extern "C" __global__ void __launch_bounds__(1024) g4_ffn_out_##S(                          \
      T* out, const T* hidden, const T* ffn, const T* wf, const T* routed, const T* wr,       \
      const T* wp, const T* scalar, float eps, int d, int zc) {                               \
    ffn_out_impl<T, 1>(out, hidden, ffn, wf, routed, wr, wp, scalar, eps, d, zc);             \
  }
INSTANTIATE(GEMMA4_ELEMENTWISE)
