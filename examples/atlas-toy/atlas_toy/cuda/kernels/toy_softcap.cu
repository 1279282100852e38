// atlas-toy's example op: out = cap * tanh(x / cap), elementwise, math in float32.
// Built once per activation dtype (INSTANTIATE): toy_softcap_bf16, toy_softcap_f16,
// toy_softcap_f32. common.cuh (to_f32, from_f32, INSTANTIATE) comes from atlas-cuda's sources.
#include "common.cuh"

template <typename T>
__device__ void toy_softcap_impl(T* out, const T* x, float cap, float inv_cap, long long n) {
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x) {
    out[i] = from_f32<T>(cap * tanhf(to_f32(x[i]) * inv_cap));
  }
}

#define TOY_SOFTCAP(T, S)                                                                      \
  extern "C" __global__ void toy_softcap_##S(T* out, const T* x, float cap, float inv_cap,     \
                                             long long n) {                                    \
    toy_softcap_impl<T>(out, x, cap, inv_cap, n);                                              \
  }
INSTANTIATE(TOY_SOFTCAP)
