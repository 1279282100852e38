// The ops of tensor and expert parallelism (references: atlas_core/parallel/ops.py).
#include "common.cuh"

// One thread per (token, choice): choices of experts held elsewhere get weight 0, id 0.
__device__ void moe_remap_ids_impl(float* w_out, int* ids_out, const float* w, const int* ids,
                                   int start, int num_local, long long n) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i >= n) return;
  int local = ids[i] - start;
  bool inside = local >= 0 && local < num_local;
  w_out[i] = inside ? w[i] : 0.f;
  ids_out[i] = inside ? local : 0;
}

// Grid: one block per token; the block copies the shard's row, or zeros for ids outside it.
template <typename T>
__device__ void embedding_shard_impl(T* out, const int* ids, const T* table, long long start,
                                     long long rows, int hidden) {
  long long local = (long long)ids[blockIdx.x] - start;
  bool inside = local >= 0 && local < rows;
  T* o = out + (long long)blockIdx.x * hidden;
  const T* src = table + (inside ? local : 0) * hidden;
  T zero = from_f32<T>(0.f);
  for (int c = threadIdx.x; c < hidden; c += blockDim.x) o[c] = inside ? src[c] : zero;
}

// Grid (ceil(vocab / blockDim), rows): out[r, v] = shards[v / n, r, v % n].
template <typename T>
__device__ void gather_vocab_shards_impl(T* out, const T* shards, int rows, int n, int vocab) {
  int r = blockIdx.y;
  int v = blockIdx.x * blockDim.x + threadIdx.x;
  if (v >= vocab) return;
  int s = v / n, c = v - s * n;
  out[(long long)r * vocab + v] = shards[((long long)s * rows + r) * n + c];
}

#define PARALLEL(T, S)                                                                        \
  extern "C" __global__ void moe_remap_ids_##S(float* w_out, int* ids_out, const float* w,     \
      const int* ids, int start, int num_local, long long n) {                                \
    moe_remap_ids_impl(w_out, ids_out, w, ids, start, num_local, n);                          \
  }                                                                                           \
  extern "C" __global__ void embedding_shard_##S(T* out, const int* ids, const T* table,       \
      long long start, long long rows, int hidden) {                                          \
    embedding_shard_impl<T>(out, ids, table, start, rows, hidden);                            \
  }                                                                                           \
  extern "C" __global__ void gather_vocab_shards_##S(T* out, const T* shards, int rows, int n, \
      int vocab) {                                                                            \
    gather_vocab_shards_impl<T>(out, shards, rows, n, vocab);                                 \
  }
INSTANTIATE(PARALLEL)
