// NVFP4 KV-cache rows (--kv-cache-dtype nvfp4): per (token, kv head) row of D values, D/2
// bytes of E2M1 codes (byte j: element 2j in the low nibble, 2j + 1 in the high one), then
// D/16 float8_e4m3fn scales, one per 16 consecutive elements; value = e2m1 * scale. The
// quantization is bit-exact with atlas_core/ops/kv_quant.py (the GPU test compares bytes).
#pragma once
#include "common.cuh"

// Storage tag of an nvfp4 pool (a uint8 array on the host side); rows are kv_row_bytes(D).
struct nvfp4 { unsigned char x; };

__host__ __device__ constexpr int kv_row_bytes(int D) { return D / 2 + D / 16; }

// Magnitude index of q = |x| / scale on 0, 0.5, 1, 1.5, 2, 3, 4, 6: nearest, ties to the even
// index, saturating at 6; NaN gives 0 (every comparison is false).
__device__ __forceinline__ u32 e2m1_index(float q) {
  return (u32)(q > 0.25f) + (u32)(q >= 0.75f) + (u32)(q > 1.25f) + (u32)(q >= 1.75f) +
         (u32)(q > 2.5f) + (u32)(q >= 3.5f) + (u32)(q > 5.f);
}

// Value of a 4-bit code (bit 3 the sign): 0, 0.5 for exponent 0, else (1 + m/2) * 2^(e-1).
__device__ __forceinline__ float e2m1_value(u32 c) {
  u32 e = (c >> 1) & 3, m = c & 1;
  float mag = e ? __uint_as_float(((e + 126) << 23) | (m << 22)) : 0.5f * (float)m;
  return (c & 8) ? -mag : mag;
}

// Quantize one group of 16 values into 8 code bytes and one scale byte (the rule of
// kv_quant.py): scale = e4m3_rn_satfinite(min(amax / 6, 448)); zero scale -> zero codes;
// code = e2m1_index(|x| / scale) | 8 if x < 0. IEEE divisions (__fdiv_rn) as the reference.
__device__ __forceinline__ void nvfp4_quantize16(const float* x, unsigned char* codes,
                                                 unsigned char* scale_byte) {
  float amax = 0.f;
#pragma unroll
  for (int i = 0; i < 16; i++) {
    float a = fabsf(x[i]);
    amax = a > amax ? a : amax;  // NaN never wins (a > amax is false)
  }
  fp8 s8 = from_f32<fp8>(fminf(__fdiv_rn(amax, 6.f), 448.f));
  float s = to_f32(s8);
  *scale_byte = s8.x;
#pragma unroll
  for (int j = 0; j < 8; j++) {
    u32 lo = 0, hi = 0;
    if (s > 0.f) {
      float a = x[2 * j], b = x[2 * j + 1];
      lo = e2m1_index(__fdiv_rn(fabsf(a), s)) | (a < 0.f ? 8u : 0u);
      hi = e2m1_index(__fdiv_rn(fabsf(b), s)) | (b < 0.f ? 8u : 0u);
    }
    codes[j] = (unsigned char)(lo | (hi << 4));
  }
}

// Lane dl's 8 values (elements 8 dl .. 8 dl + 7) of an nvfp4 row: 4 code bytes and the scale
// of their 16-element group. A Vec8 stand-in for the decode kernel (kv_load below).
struct Nvfp4Vec8 {
  u32 codes;
  unsigned char scale;
  __device__ __forceinline__ void load(const unsigned char* row, int D, int dl) {
    codes = *reinterpret_cast<const u32*>(row + dl * 4);
    scale = row[D / 2 + dl / 2];
  }
  __device__ __forceinline__ void to_float(float* f) const {
    fp8 s8;
    s8.x = scale;
    float s = to_f32(s8);
#pragma unroll
    for (int i = 0; i < 8; i++) f[i] = e2m1_value((codes >> (4 * i)) & 15u) * s;
  }
};

// The decode kernel's K/V register vector for cache type C, and its load of lane dl's slice
// of cache row `row` (head dim D): Vec8<C> at element row * D + 8 dl, or an nvfp4 row's codes
// and scale.
template <typename C> struct KVVec { typedef Vec8<C> type; };
template <> struct KVVec<nvfp4> { typedef Nvfp4Vec8 type; };

template <typename C, int D>
__device__ __forceinline__ void kv_load(Vec8<C>& v, const C* base, long long row, int dl) {
  v.load(base + row * D + dl * 8);
}
template <typename C, int D>
__device__ __forceinline__ void kv_load(Nvfp4Vec8& v, const C* base, long long row, int dl) {
  v.load(reinterpret_cast<const unsigned char*>(base) + row * kv_row_bytes(D), D, dl);
}
