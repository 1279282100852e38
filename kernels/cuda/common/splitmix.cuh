// The sampler's counter-based random stream: a splitmix64 hash of (seed, step, index) turned
// into a double in (0, 1). Bit for bit atlas_core.ops.sampling.random_uniform, so seeded draws
// (sample_split_f32) and XTC's coin (apply_xtc_f32) match the NumPy references.
#pragma once
#include "common.cuh"

__device__ __forceinline__ double uniform(u64 seed, u64 step, u64 i) {
  u64 h = seed * 0x9E3779B97F4A7C15ull + step * 0xBF58476D1CE4E5B9ull + i * 0x94D049BB133111EBull;
  h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9ull;
  h = (h ^ (h >> 27)) * 0x94D049BB133111EBull;
  h ^= h >> 31;
  return ((double)(h >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}
