// NVFP4 KV cache (kv_nvfp4.cuh): the cache write, and the dequantizing gather that lets the
// tensor-core prefill kernel read a sequence's nvfp4 history from a dense scratch copy.
#include "kv_nvfp4.cuh"

// kv_nvfp4_write_<dtype>: grid (token), any block size. k, v: [num_tokens, KH, D] rows; each
// thread packs 16-element groups (K then V) of its token into cache slot slots[token] (-1:
// skipped). x * inv_scale is quantized (inv_scale is 1 in the engine: bit-exact with the
// reference's x / kv_scale).
template <typename T>
__device__ void kv_nvfp4_write_impl(unsigned char* kc, unsigned char* vc, const T* k, const T* v,
                                    const int* slots, int KH, int D, float inv_scale) {
  long long slot = slots[blockIdx.x];
  if (slot < 0) return;
  int groups = KH * D / 16, R = kv_row_bytes(D);
  for (int gi = threadIdx.x; gi < 2 * groups; gi += blockDim.x) {
    bool is_k = gi < groups;
    int g = is_k ? gi : gi - groups, kh = g / (D / 16), gg = g % (D / 16);
    const T* src = (is_k ? k : v) + (long long)blockIdx.x * KH * D + (long long)g * 16;
    float x[16];
#pragma unroll
    for (int i = 0; i < 16; i++) x[i] = to_f32(src[i]) * inv_scale;
    unsigned char* row = (is_k ? kc : vc) + (slot * KH + kh) * R;
    unsigned char codes[8];
    nvfp4_quantize16(x, codes, row + D / 2 + gg);
    // rows are 9 D / 16 bytes: 4-byte aligned only (D = 64: 36 bytes)
    u32* dst = reinterpret_cast<u32*>(row + gg * 8);
    dst[0] = codes[0] | (u32)codes[1] << 8 | (u32)codes[2] << 16 | (u32)codes[3] << 24;
    dst[1] = codes[4] | (u32)codes[5] << 8 | (u32)codes[6] << 16 | (u32)codes[7] << 24;
  }
}

// kv_nvfp4_gather_<dtype>: grid (num_seqs * max_blocks), any block size. Block j of sequence b
// (cache block bt[b, j]) is dequantized into scratch block b * max_blocks + j of ko / vo
// ([num_seqs * max_blocks, bs, KH, D] in the activation dtype), and new_bt[b, j] names it.
// Blocks past the sequence's length (arbitrary table entries) are zero-filled instead: the
// prefill kernel may read a tile past the last key (masked, but NaN * 0).
template <typename T>
__device__ void kv_nvfp4_gather_impl(T* ko, T* vo, int* new_bt, const unsigned char* kc,
                                     const unsigned char* vc, const int* bt, const int* seq_lens,
                                     int max_blocks, int bs, int KH, int D) {
  int b = blockIdx.x / max_blocks, j = blockIdx.x % max_blocks;
  bool live = (long long)j * bs < seq_lens[b];
  long long src_block = live ? bt[(long long)b * max_blocks + j] : 0;
  if (threadIdx.x == 0) new_bt[blockIdx.x] = blockIdx.x;
  int groups = bs * KH * D / 16, R = kv_row_bytes(D);
  for (int gi = threadIdx.x; gi < 2 * groups; gi += blockDim.x) {
    bool is_k = gi < groups;
    int g = is_k ? gi : gi - groups;
    int r = g / (D / 16), gg = g % (D / 16);  // r: (offset in block, kv head) row
    T* dst = (is_k ? ko : vo) + (long long)blockIdx.x * bs * KH * D + (long long)g * 16;
    float f[16];
    if (live) {
      const unsigned char* row = (is_k ? kc : vc) + (src_block * bs * KH + r) * R;
      Nvfp4Vec8 lo, hi;
      lo.load(row, D, 2 * gg);
      hi.load(row, D, 2 * gg + 1);
      lo.to_float(f);
      hi.to_float(f + 8);
    } else {
#pragma unroll
      for (int i = 0; i < 16; i++) f[i] = 0.f;
    }
#pragma unroll
    for (int i = 0; i < 16; i++) dst[i] = from_f32<T>(f[i]);
  }
}

#define KV_NVFP4(T, S)                                                                        \
  extern "C" __global__ void kv_nvfp4_write_##S(unsigned char* kc, unsigned char* vc,        \
                                                const T* k, const T* v, const int* slots,     \
                                                int KH, int D, float inv) {                   \
    kv_nvfp4_write_impl<T>(kc, vc, k, v, slots, KH, D, inv);                                  \
  }                                                                                           \
  extern "C" __global__ void kv_nvfp4_gather_##S(T* ko, T* vo, int* nbt,                      \
                                                 const unsigned char* kc,                     \
                                                 const unsigned char* vc, const int* bt,      \
                                                 const int* sl, int mb, int bs, int KH,       \
                                                 int D) {                                     \
    kv_nvfp4_gather_impl<T>(ko, vo, nbt, kc, vc, bt, sl, mb, bs, KH, D);                      \
  }
INSTANTIATE(KV_NVFP4)
