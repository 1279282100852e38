// Bidirectional attention over dense K/V on CUDA cores: the split decode kernel
// (attention_decode.cuh) with every query of a sequence seeing all of its keys. What the
// bidirectional prefill attention (vision towers) runs where the flash kernel does not apply
// (float32, head dims it lacks, policy attention=simt). A module of its own: compiled only
// when a model asks for it.
#include "attention_decode.cuh"

// attn_bidir_<dtype>_d<D>_h<HB>: same arguments as attn_dec_* (no block tables, no seq_lens).
#define BIDIR_ONE(T, S, D, HB)                                                                \
  extern "C" __global__ void __launch_bounds__(128) attn_bidir_##S##_d##D##_h##HB(         \
      T* out, float* pa, float* pm, int* cnt, const T* q, T* k, T* v,                         \
      const int* bt, const int* sl, const int* cu, int H, int KH, int bs, int mb, int ns,     \
      int nsp, float sc, float kvs) {                                                         \
    AttnArgs a{H, KH, bs, mb, ns, nsp, sc, kvs};                                               \
    attn_dec_impl<T, T, D, HB, false, true>(out, pa, pm, cnt, q, k, v, bt, sl, cu, a,         \
                                            DecRope{});                                       \
  }
#define BIDIR_HB(T, S, D) BIDIR_ONE(T, S, D, 1) BIDIR_ONE(T, S, D, 2) BIDIR_ONE(T, S, D, 4)
#define BIDIR(T, S)                                                                           \
  BIDIR_HB(T, S, 16) BIDIR_HB(T, S, 32) BIDIR_HB(T, S, 64) BIDIR_HB(T, S, 128)               \
  BIDIR_HB(T, S, 256)
INSTANTIATE(BIDIR)
