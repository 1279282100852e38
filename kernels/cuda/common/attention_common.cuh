// Shared by the attention kernels (attention.cu, attention_decode.cuh): launch arguments, the
// query token -> sequence lookup, the lane-group score and the store, merge and write of a
// block's partials.
#pragma once
#include "common.cuh"

struct AttnArgs {
  int num_heads, num_kv_heads, block_size, max_blocks, num_seqs, num_splits;
  float scale_log2, kv_scale;
  // Sliding window (attn_dec_swa_*): a query at position p sees keys p - window + 1 .. p only;
  // 0 (every other kernel, which leaves it unset) is the whole causal context.
  int window;
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

// A key's score against one query head: the lane's 8 dimensions, summed over the group of lpk
// lanes that holds the whole head (every lane of the group gets the sum).
__device__ __forceinline__ float lane_group_dot(const float* q, const float* k, int lpk) {
  float s = 0.f;
#pragma unroll
  for (int e = 0; e < 8; e++) s += q[e] * k[e];
  for (int o = lpk / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  return s;
}

// Lane group g's online-softmax partials (dl: the lane's 8 columns within the group) into
// shared memory for attn_group_merge, then a block barrier.
template <int NG, int HB, int D>
__device__ __forceinline__ void attn_group_store(float (&sm_acc)[NG][HB][D], float (&sm_m)[NG][HB],
                                                 float (&sm_l)[NG][HB], int g, int dl,
                                                 const float (*acc)[8], const float* m,
                                                 const float* l) {
#pragma unroll
  for (int hh = 0; hh < HB; hh++) {
#pragma unroll
    for (int e = 0; e < 8; e++) sm_acc[g][hh][dl * 8 + e] = acc[hh][e];
    if (dl == 0) { sm_m[g][hh] = m[hh]; sm_l[g][hh] = l[hh]; }
  }
  __syncthreads();
}

// Merge the NG lane groups' online-softmax partials of head hh at column d (in shared memory):
// the running max mx, the softmax sum L and the weighted accumulator A.
template <int NG, int HB, int D>
__device__ __forceinline__ void attn_group_merge(const float (&sm_acc)[NG][HB][D],
                                                 const float (&sm_m)[NG][HB],
                                                 const float (&sm_l)[NG][HB], int hh, int d,
                                                 float& mx, float& L, float& A) {
  mx = NEG_INF;
  for (int gg = 0; gg < NG; gg++) mx = fmaxf(mx, sm_m[gg][hh]);
  L = 0.f;
  A = 0.f;
  if (mx != NEG_INF) {
    for (int gg = 0; gg < NG; gg++) {
      float w = exp2f(sm_m[gg][hh] - mx);
      L += sm_l[gg][hh] * w;
      A += sm_acc[gg][hh][d] * w;
    }
  }
}

// After attn_group_store: merge the block's lane groups and write head th0 + hh's output (one
// split) or this split's partial (accumulator row, then (max, sum)) for the combine.
template <typename T, int NG, int HB, int D>
__device__ __forceinline__ void attn_group_write(T* out, float* part_acc, float* part_ml,
                                                 const float (&sm_acc)[NG][HB][D],
                                                 const float (&sm_m)[NG][HB],
                                                 const float (&sm_l)[NG][HB], long long th0,
                                                 int split, int num_splits, bool single,
                                                 float kv_scale) {
  for (int idx = threadIdx.x; idx < HB * D; idx += blockDim.x) {
    int hh = idx / D, d = idx % D;
    float mx, L, A;
    attn_group_merge<NG, HB, D>(sm_acc, sm_m, sm_l, hh, d, mx, L, A);
    long long th = th0 + hh;
    if (single) {
      out[th * D + d] = from_f32<T>(L > 0.f ? A / L * kv_scale : 0.f);
    } else {
      part_acc[(th * num_splits + split) * D + d] = A;
      if (d == 0) {
        part_ml[(th * num_splits + split) * 2] = mx;
        part_ml[(th * num_splits + split) * 2 + 1] = L;
      }
    }
  }
}
