// atlas-gemma4: mul and softcap (references atlas_gemma4.ops.mul / softcap), float32 math,
// stored in the first operand's dtype. Grid-stride loops: both ops touch a row of hidden
// states or logits per token, a sliver of a step.
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
  }
INSTANTIATE(GEMMA4_ELEMENTWISE)
