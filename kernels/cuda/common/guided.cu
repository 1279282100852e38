// Guided decoding: forbid the tokens a grammar rules out by setting their logits to -inf.
// Bit v % 32 of word v / 32 of a row's int32 bitmask set means token v is allowed (llguidance's
// little-endian layout). Grid (ceil(vocab / blockDim), num_seqs); logits float32.
#include "common.cuh"

extern "C" __global__ void apply_token_bitmask_f32(float* out, const float* logits,
                                                   const int* bitmask, int vocab, int width) {
  int v = blockIdx.x * blockDim.x + threadIdx.x;
  if (v >= vocab) return;
  long long row = blockIdx.y;
  u32 word = (u32)bitmask[row * width + (v >> 5)];
  float x = logits[row * vocab + v];
  out[row * vocab + v] = (word >> (v & 31)) & 1u ? x : NEG_INF;
}
