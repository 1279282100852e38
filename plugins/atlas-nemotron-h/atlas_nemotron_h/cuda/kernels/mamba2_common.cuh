// atlas-nemotron-h: what the Mamba-2 kernel modules share (mamba2.cu, mamba2_decode.cu).
#pragma once
#include "common.cuh"

#define M2_KMAX 8
#define M2_WARPS 4
#define M2_CHUNK 32    // most tokens per chunk of the chunked-time scan (lanes of its y sums)
#define M2_STAGE 8192  // floats of that scan's staged B and C rows (tc * 2 N at most)

__device__ __forceinline__ float m2_silu(float x) { return x / (1.f + expf(-x)); }
__device__ __forceinline__ float m2_softplus(float x) {
  return x > 20.f ? x : log1pf(expf(fminf(x, 20.f)));
}
