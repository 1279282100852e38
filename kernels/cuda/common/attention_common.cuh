// Shared by the attention kernels (attention.cu, attention_decode.cu): launch arguments and the
// query token -> sequence lookup.
#pragma once
#include "common.cuh"

struct AttnArgs {
  int num_heads, num_kv_heads, block_size, max_blocks, num_seqs, num_splits;
  float scale_log2, kv_scale;
};

// Sequence b with cu[b] <= t < cu[b + 1] (binary search over the n sequences' query starts).
__device__ __forceinline__ int find_seq(const int* cu, int n, int t) {
  int lo = 0, hi = n - 1;
  while (lo < hi) {
    int mid = (lo + hi + 1) >> 1;
    if (cu[mid] <= t) lo = mid; else hi = mid - 1;
  }
  return lo;
}
