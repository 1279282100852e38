// Paged decode / chunked-prefill attention with the split combine done in-kernel (the
// kernels are in attention_decode.cuh).
#include "attention_decode.cuh"

// attn_dec[_fp8|_nvfp4]_<dtype>_d<D>_h<HB>: _fp8 reads a float8_e4m3fn paged cache (head dims
// 64-256), _nvfp4 packed nvfp4 rows (kv_nvfp4.cuh; head dims 64-256, multiples of 32).
#define DEC_ONE(T, S, D, HB, C, CS)                                                           \
  extern "C" __global__ void __launch_bounds__(128) attn_dec##CS##_##S##_d##D##_h##HB(     \
      T* out, float* pa, float* pm, int* cnt, const T* q, C* k, C* v,                         \
      const int* bt, const int* sl, const int* cu, int H, int KH, int bs, int mb, int ns,     \
      int nsp, float sc, float kvs) {                                                         \
    AttnArgs a{H, KH, bs, mb, ns, nsp, sc, kvs};                                               \
    attn_dec_impl<T, C, D, HB, false>(out, pa, pm, cnt, q, k, v, bt, sl, cu, a, DecRope{});   \
  }
#define DEC_HB(T, S, D, C, CS)                                                                \
  DEC_ONE(T, S, D, 1, C, CS) DEC_ONE(T, S, D, 2, C, CS) DEC_ONE(T, S, D, 4, C, CS)
#define DEC(T, S)                                                                             \
  DEC_HB(T, S, 16, T, ) DEC_HB(T, S, 32, T, ) DEC_HB(T, S, 64, T, )                           \
  DEC_HB(T, S, 128, T, ) DEC_HB(T, S, 256, T, )                                               \
  DEC_HB(T, S, 64, fp8, _fp8) DEC_HB(T, S, 128, fp8, _fp8) DEC_HB(T, S, 256, fp8, _fp8)     \
  DEC_HB(T, S, 64, nvfp4, _nvfp4) DEC_HB(T, S, 128, nvfp4, _nvfp4)                           \
  DEC_HB(T, S, 256, nvfp4, _nvfp4)
INSTANTIATE(DEC)

// attn_dec_swa_<dtype>_d<D>_h<HB>: the same kernel over the last `win` keys of each query
// (sliding-window layers: Gemma-2/3/4, Mistral; the op is the plugin's, the kernel is this one).
#define DEC_SWA_ONE(T, S, D, HB)                                                              \
  extern "C" __global__ void __launch_bounds__(128) attn_dec_swa_##S##_d##D##_h##HB(        \
      T* out, float* pa, float* pm, int* cnt, const T* q, T* k, T* v, const int* bt,          \
      const int* sl, const int* cu, int H, int KH, int bs, int mb, int ns, int nsp, float sc, \
      float kvs, int win) {                                                                   \
    AttnArgs a{H, KH, bs, mb, ns, nsp, sc, kvs, win};                                          \
    attn_dec_impl<T, T, D, HB, false>(out, pa, pm, cnt, q, k, v, bt, sl, cu, a, DecRope{});   \
  }
#define DEC_SWA(T, S)                                                                         \
  DEC_SWA_ONE(T, S, 64, 1) DEC_SWA_ONE(T, S, 64, 2) DEC_SWA_ONE(T, S, 64, 4)                   \
  DEC_SWA_ONE(T, S, 128, 1) DEC_SWA_ONE(T, S, 128, 2) DEC_SWA_ONE(T, S, 128, 4)                \
  DEC_SWA_ONE(T, S, 256, 1) DEC_SWA_ONE(T, S, 256, 2) DEC_SWA_ONE(T, S, 256, 4)
INSTANTIATE(DEC_SWA)
