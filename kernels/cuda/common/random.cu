// fill_random: out[i] = mean + std * u(i), u uniform on [-sqrt(3), sqrt(3)) (unit variance)
// from a splitmix64 hash of (seed, i). Deterministic for any size and launch shape; one
// store per element, so a random-weight model fills at about copy bandwidth.
#include "common.cuh"

__device__ __forceinline__ float unit_uniform(u64 seed, long long i) {
  u64 z = seed + (u64)(i + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return ((float)(z >> 40) * (1.f / 16777216.f) - 0.5f) * 3.4641016f;
}

template <typename T>
__device__ void fill_random_impl(T* out, long long n, u64 seed, float mean, float std) {
  long long stride = (long long)gridDim.x * blockDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = from_f32<T>(mean + std * unit_uniform(seed, i));
}

#define FILL_RANDOM(T, S)                                                                     \
  extern "C" __global__ void fill_random_##S(T* out, long long n, u64 seed, float mean,       \
                                             float std) {                                     \
    fill_random_impl<T>(out, n, seed, mean, std);                                             \
  }
INSTANTIATE(FILL_RANDOM)
