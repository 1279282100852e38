// atlas-gemma4: what the sliding_window_attention kernels share (gemma4_attention.cu,
// gemma4_attention_mma.cu): launch arguments, the window's first key, cache rows through the
// block table, vector loads and the tile -> (sequence, first token) walk.
#pragma once
#include "attention_common.cuh"

struct SwaArgs {
  int num_heads, num_kv_heads, block_size, max_blocks, num_seqs, num_splits, window;
  float scale_log2;
};

__device__ __forceinline__ int swa_first(int pos, int window) {
  return window > 0 ? max(0, pos - window + 1) : 0;
}

// Row (slot * KH + kh) of the cache holding key position j of the sequence with table bt_row.
__device__ __forceinline__ long long swa_row(const int* bt_row, int j, int bs, int KH, int kh) {
  return ((long long)__ldg(bt_row + j / bs) * bs + j % bs) * KH + kh;
}

template <typename T, int N>
__device__ __forceinline__ void swa_load(float* f, const T* p) {
#pragma unroll
  for (int v = 0; v < N / 8; v++) {
    Vec8<T> x;
    x.load(p + 8 * v);
    x.to_float(f + 8 * v);
  }
}

// The sequence and first query token of tile `x` (tiles of BT tokens, packed by sequence);
// false past the last tile.
__device__ __forceinline__ bool swa_tile_of(const int* cu_q, int num_seqs, int x, int BT,
                                            int& b, int& t0) {
  int seen = 0;
  for (b = 0; b < num_seqs; b++) {
    int n = cu_q[b + 1] - cu_q[b], tiles = (n + BT - 1) / BT;
    if (x < seen + tiles) {
      t0 = cu_q[b] + (x - seen) * BT;
      return true;
    }
    seen += tiles;
  }
  return false;
}

#define SWA_ARGS SwaArgs a{H, KH, bs, mb, ns, nsp, win, sc}
