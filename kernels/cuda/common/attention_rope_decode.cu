// Decode attention with the attention prologue folded in: per-head RMSNorm of q and k, rotary,
// KV-cache write and split attention in one kernel (pure decode steps: one query token per
// sequence). Same grid and split plan as attn_dec (attention_decode.cuh); q is read from the
// fused qkv projection rows.
#include "attention_decode.cuh"

// rope_attn_dec[_fp8]_<dtype>_d<D>_h<HB>: q/k norm weights in the activation dtype or, with
// nf32, float32 (either may be null); _fp8: a float8_e4m3fn cache scaled by 1 / kvs.
#define RDEC_ONE(T, S, D, HB, C, CS)                                                          \
  extern "C" __global__ void __launch_bounds__(128) rope_attn_dec##CS##_##S##_d##D##_h##HB( \
      T* out, float* pa, float* pm, int* cnt, const T* qkv, C* k, C* v, const int* bt,       \
      const int* sl, const int* cu, int H, int KH, int bs, int mb, int ns, int nsp, float sc, \
      float kvs, const int* pos, const float* cs, const int* slots, const void* qn,           \
      const void* kn, int nf32, int rot, int neox, float eps) {                               \
    AttnArgs a{H, KH, bs, mb, ns, nsp, sc, kvs};                                               \
    DecRope r{pos, cs, slots, qn, kn, nf32, RopeArgs{H, KH, D, rot, neox, eps, 1.f / kvs}};   \
    attn_dec_impl<T, C, D, HB, true>(out, pa, pm, cnt, qkv, k, v, bt, sl, cu, a, r);          \
  }
#define RDEC_HB(T, S, D, C, CS)                                                               \
  RDEC_ONE(T, S, D, 1, C, CS) RDEC_ONE(T, S, D, 2, C, CS) RDEC_ONE(T, S, D, 4, C, CS)
#define RDEC(T, S)                                                                            \
  RDEC_HB(T, S, 64, T, ) RDEC_HB(T, S, 128, T, )                                             \
  RDEC_HB(T, S, 64, fp8, _fp8) RDEC_HB(T, S, 128, fp8, _fp8)
INSTANTIATE(RDEC)
