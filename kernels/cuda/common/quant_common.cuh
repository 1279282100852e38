// Quantized weights in registers (atlas_core/ops/quant.py formats), shared by quant_linear.cu
// and quant_gemm.cu: code decoders and the multipliers of one lane's 16-byte weight chunk.
// Both decoders go through f16 bit patterns: an e4m3 code c becomes the f16 with bits
// (c & 0x80) << 8 | (c & 0x7f) << 7, worth 2^-8 of c (subnormals included), and an e2m1 code
// the f16 (c & 8) << 12 | (c & 7) << 9, worth 2^-14 of it; the scale carries the power of two.
// Scale index of element (n, k) for fp8: (n / bn) * s_row + k / bk (tensor, channel and block
// scales all take this form; the host passes bn, bk, s_row).
// Include after common.cuh.
#pragma once

__device__ __forceinline__ void half2_to_float2(u32 h, float& lo, float& hi) {
  unsigned short a = (unsigned short)(h & 0xffff), b = (unsigned short)(h >> 16);
  asm("cvt.f32.f16 %0, %1;" : "=f"(lo) : "h"(a));
  asm("cvt.f32.f16 %0, %1;" : "=f"(hi) : "h"(b));
}
// Two e4m3 codes (bits 0-7 and 8-15 of v) as an f16 pair, each 2^-8 of its value.
__device__ __forceinline__ u32 e4m3x2_bits(u32 v) {
  return ((v & 0x7fu) << 7) | ((v & 0x80u) << 8) | ((v & 0x7f00u) << 15) | ((v & 0x8000u) << 16);
}
// The two e2m1 codes of one byte (low nibble first) as an f16 pair, each 2^-14 of its value.
__device__ __forceinline__ u32 e2m1x2_bits(u32 b) {
  return ((b & 0x7u) << 9) | ((b & 0x8u) << 12) | ((b & 0x70u) << 21) | ((b & 0x80u) << 24);
}
// 16 bytes of fp8 codes -> 16 floats (times 2^-8).
__device__ __forceinline__ void fp8x16_to_float(const uint4& raw, float* f) {
  const u32 w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; i++) {
    half2_to_float2(e4m3x2_bits(w[i]), f[4 * i], f[4 * i + 1]);
    half2_to_float2(e4m3x2_bits(w[i] >> 16), f[4 * i + 2], f[4 * i + 3]);
  }
}
// 16 bytes of packed e2m1 pairs -> 32 floats (times 2^-14).
__device__ __forceinline__ void e2m1x32_to_float(const uint4& raw, float* f) {
  const u32 w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; i++)
#pragma unroll
    for (int b = 0; b < 4; b++)
      half2_to_float2(e2m1x2_bits((w[i] >> (8 * b)) & 0xffu), f[8 * i + 2 * b],
                      f[8 * i + 2 * b + 1]);
}

struct QScale {
  const void* scale;
  const float* gscale;
  int bn, bk, s_row;
};

// Elements one lane's 16-byte load covers, and the multipliers of that chunk (fp8: one; nvfp4:
// two groups of 16), the decoders' power of two included.
template <int FMT> struct QChunk;
template <> struct QChunk<0> {
  static constexpr int ELEMS = 16, BYTES_PER_ROW_DIV = 1;
  __device__ __forceinline__ static void scales(const QScale& q, int n, int k, int K, float g,
                                                float* s) {
    s[0] = reinterpret_cast<const float*>(q.scale)[(n / q.bn) * q.s_row + k / q.bk] * 256.f;
  }
  __device__ __forceinline__ static void decode(const uint4& raw, float* f) {
    fp8x16_to_float(raw, f);
  }
};
template <> struct QChunk<1> {
  static constexpr int ELEMS = 32, BYTES_PER_ROW_DIV = 2;
  __device__ __forceinline__ static void scales(const QScale& q, int n, int k, int K, float g,
                                                float* s) {
    const fp8* sc = reinterpret_cast<const fp8*>(q.scale) + (long long)n * (K / 16) + k / 16;
    s[0] = to_f32(sc[0]) * g * 16384.f;
    s[1] = to_f32(sc[1]) * g * 16384.f;
  }
  __device__ __forceinline__ static void decode(const uint4& raw, float* f) {
    e2m1x32_to_float(raw, f);
  }
};

// ---- Integer decoders of quant_skinny.cu (and the vector dequantization of quant_linear.cu):
// codes into T pairs that carry a known power of two, fixed by one packed multiply. ----
__device__ __forceinline__ u32 prmt(u32 a, u32 b, u32 sel) {
  u32 r; asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel)); return r;
}

template <typename T> struct QPair;
template <> struct QPair<bf16> {
  static constexpr int SH8 = 4, SH4 = 6;
  __device__ __forceinline__ static float fp8_fix() { return __uint_as_float(247u << 23); }  // 2^120
  __device__ __forceinline__ static float fp4_mul() { return __uint_as_float(245u << 23); }  // 2^118
  __device__ __forceinline__ static float fp4_out() { return 256.f; }  // 2^(126 - 118)
  __device__ __forceinline__ static u32 pair(float v) {
    u32 r; asm("cvt.rn.bf16x2.f32 %0, %1, %1;" : "=r"(r) : "f"(v)); return r;
  }
  // Both halves the f16 in bits 0-15 (lo) or 16-31 (hi) of h, times fp4_mul(): exact.
  __device__ __forceinline__ static u32 scale_pair(u32 h, int hi) {
    float f; unsigned short b = (unsigned short)(hi ? h >> 16 : h & 0xffff);
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(b));
    return pair(f * fp4_mul());
  }
  __device__ __forceinline__ static u32 mul(u32 a, u32 b) {
    u32 r; asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b)); return r;
  }
};
template <> struct QPair<f16> {
  static constexpr int SH8 = 7, SH4 = 9;
  __device__ __forceinline__ static float fp8_fix() { return 256.f; }  // 2^8
  __device__ __forceinline__ static float fp4_mul() { return 128.f; }  // 2^7
  __device__ __forceinline__ static float fp4_out() { return 128.f; }  // 2^(14 - 7)
  __device__ __forceinline__ static u32 pair(float v) {
    u32 r; asm("cvt.rn.f16x2.f32 %0, %1, %1;" : "=r"(r) : "f"(v)); return r;
  }
  __device__ __forceinline__ static u32 scale_pair(u32 h, int hi) {
    u32 dup = prmt(h, 0, hi ? 0x3232 : 0x1010);
    return mul(dup, 0x58005800u);  // 128 = 0x5800 in f16
  }
  __device__ __forceinline__ static u32 mul(u32 a, u32 b) {
    u32 r; asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b)); return r;
  }
};

// Two e4m3 codes (bits 0-15 of v) as an f16 pair (sm_89+ conversion).
__device__ __forceinline__ u32 e4m3x2_to_f16x2(u32 v) {
  u32 r; unsigned short b = (unsigned short)(v & 0xffff);
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(r) : "h"(b)); return r;
}
// A 16-byte weight load that does not allocate in L1 (streamed once; L1 keeps x).
__device__ __forceinline__ uint4 ld_stream(const void* p) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  return r;
}
__device__ __forceinline__ u32 word_of(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}
// Codes 0 and 2 (ODD: 1 and 3) of four e4m3 bytes as a T pair, times the decoder's offset.
template <typename T, int ODD> __device__ __forceinline__ u32 fp8_pair(u32 v) {
  u32 u = ODD ? v >> 8 : v;
  return ((u & 0x007f007fu) << QPair<T>::SH8) | ((u & 0x00800080u) << 8);
}
// Codes i and i + 4 of eight e2m1 nibbles as a T pair, times the decoder's offset.
template <typename T> __device__ __forceinline__ u32 fp4_pair(u32 v, int i) {
  u32 u = v >> (4 * i);
  return ((u & 0x00070007u) << QPair<T>::SH4) | ((u & 0x00080008u) << 12);
}

// ---- One skinny decode step (quant_skinny.cu; reusable by any kernel that keeps the weight as
// the mma.sync m16n8k16 A operand): a lane (g = lane / 4, t = lane % 4) holds 32 codes of each
// of its two weight rows (16 g-row and g+8-row of a 16-row tile) at K offset k0 + 32 t of a
// 128-wide step; they become the A fragments a[st] of the step's 8 MMAs, st = 0..7, in the
// decoders' K order, and qx_frag gives x (the B operand) the same order. ----

// Where a lane's codes sit in a weight row's 128-wide step: 16-byte chunk v (FP8 0-1, NVFP4 0)
// at byte 16 t + 64 v, so one load instruction of a warp reads whole 32-byte sectors (FP8 lanes
// once held 32 contiguous bytes, and each of their two loads fetched half of every sector).
__device__ __forceinline__ int qchunk_offset(int t, int v) { return 16 * t + 64 * v; }
// The lane's 32 elements of x row `row` (zeros past M) for the step at K offset k0, in the
// order of its codes: FP8 k0 + 16 t + [0, 16) then k0 + 64 + 16 t + [0, 16); NVFP4 (two codes
// a byte) k0 + 32 t + [0, 32); dense (FMT 2, weights in the activation dtype: the FP8 byte
// offsets, two bytes an element) k0 + 8 t + 32 c + [0, 8) for c = 0..3.
template <typename T, int FMT>
__device__ __forceinline__ void qx_load(uint4 (&xv)[4], const T* x, int row, int M, int K, int k0,
                                        int t) {
#pragma unroll
  for (int c = 0; c < 4; c++) {
    int k = FMT == 0   ? k0 + 16 * t + 64 * (c >> 1) + 8 * (c & 1)
            : FMT == 1 ? k0 + 32 * t + 8 * c
                       : k0 + 8 * t + 32 * c;
    xv[c] = row < M ? *reinterpret_cast<const uint4*>(x + (long long)row * K + k)
                    : make_uint4(0, 0, 0, 0);
  }
}
// FP8: w[r] = the row's 32 codes (2 x 16 B); a = codes times 2^0 (the decoder's offset removed).
template <typename T>
__device__ __forceinline__ void qdecode_fp8(const uint4 (&w)[2][2], u32 (&a)[8][4]) {
  using P = QPair<T>;
  const u32 fix = P::pair(P::fp8_fix());
#pragma unroll
  for (int j = 0; j < 8; j++)
#pragma unroll
    for (int r = 0; r < 2; r++) {
      u32 v = word_of(w[r][j >> 2], j & 3);
      a[j][r] = P::mul(fp8_pair<T, 0>(v), fix);
      a[j][2 + r] = P::mul(fp8_pair<T, 1>(v), fix);
    }
}
// NVFP4: w[r][0] = the row's 32 codes (16 B); sc[r] = its two e4m3 group scales (16 bits, the
// first group low); a = e2m1 * group scale * 2^-8 (bf16) or 2^-7 (f16): QPair::fp4_out() and
// the global scale multiply the result.
template <typename T>
__device__ __forceinline__ void qdecode_nvfp4(const uint4 (&w)[2][1], const u32 (&sc)[2],
                                              u32 (&a)[8][4]) {
  using P = QPair<T>;
#pragma unroll
  for (int r = 0; r < 2; r++) {
    u32 h = e4m3x2_to_f16x2(sc[r]);
    u32 m0 = P::scale_pair(h, 0), m1 = P::scale_pair(h, 1);
#pragma unroll
    for (int wi = 0; wi < 4; wi++) {
      u32 v = word_of(w[r][0], wi), m = wi < 2 ? m0 : m1;
      a[2 * wi][r] = P::mul(fp4_pair<T>(v, 0), m);
      a[2 * wi][2 + r] = P::mul(fp4_pair<T>(v, 1), m);
      a[2 * wi + 1][r] = P::mul(fp4_pair<T>(v, 2), m);
      a[2 * wi + 1][2 + r] = P::mul(fp4_pair<T>(v, 3), m);
    }
  }
}
// The B fragment of mma st from the lane's 32 elements of one x row (xv, K order): FP8 pairs
// codes 4 st + {0, 2} and 4 st + {1, 3} (x words 2 st, 2 st + 1); NVFP4 codes 8 wi + {p, p + 4}
// and 8 wi + {p + 1, p + 5}, wi = st / 2, p = 2 (st % 2). Dense (FMT 2) pairs as FP8, and the
// A fragments of its weight rows are made the same way from their words.
template <int FMT>
__device__ __forceinline__ void qx_frag(const uint4 (&xv)[4], int st, u32 (&b)[2]) {
  int wlo = FMT != 1 ? 2 * st : 4 * (st >> 1) + (st & 1);
  int whi = FMT != 1 ? 2 * st + 1 : wlo + 2;
  u32 lo = word_of(xv[wlo >> 2], wlo & 3), hi = word_of(xv[whi >> 2], whi & 3);
  b[0] = prmt(lo, hi, 0x5410);
  b[1] = prmt(lo, hi, 0x7632);
}
// Dense weights (FMT 2, already in T): the A fragments of the lane's two rows (w[r]: 32
// elements, the qx_load order) paired as qx_frag pairs x, so the K orders agree.
__device__ __forceinline__ void qdecode_dense(const uint4 (&w)[2][4], u32 (&a)[8][4]) {
#pragma unroll
  for (int st = 0; st < 8; st++)
#pragma unroll
    for (int r = 0; r < 2; r++) {
      u32 pair[2];
      qx_frag<2>(w[r], st, pair);
      a[st][r] = pair[0];
      a[st][2 + r] = pair[1];
    }
}

