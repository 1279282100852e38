// Sigmoid gating: out = x * sigmoid(gate), gate [rows, d] or [rows, 1] (gate_width 1: broadcast
// along the row). Serves gated attention outputs and the shared-expert gate. Math in float32.
#include "common.cuh"

template <typename T>
__device__ void sigmoid_mul_impl(T* out, const T* x, const T* gate, int d, int gate_width,
                                 long long n) {
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x) {
    float gv = to_f32(gate[gate_width == 1 ? i / d : i]);
    out[i] = from_f32<T>(to_f32(x[i]) * (1.f / (1.f + expf(-gv))));
  }
}

#define SIGMOID_MUL(T, S)                                                                      \
  extern "C" __global__ void sigmoid_mul_##S(T* out, const T* x, const T* gate, int d,         \
      int gate_width, long long n) {                                                           \
    sigmoid_mul_impl<T>(out, x, gate, d, gate_width, n);                                       \
  }
INSTANTIATE(SIGMOID_MUL)
