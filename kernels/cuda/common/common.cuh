// Shared device helpers for every Atlas kernel: storage types, conversions, vector loads,
// warp and block reductions. Self-contained (no CUDA headers) so NVRTC needs no include path.
#pragma once

typedef unsigned int u32;
typedef unsigned long long u64;
#define NEG_INF __int_as_float(0xff800000)

struct bf16 { unsigned short x; };
struct f16 { unsigned short x; };

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(bf16 v) { return __uint_as_float(((u32)v.x) << 16); }
__device__ __forceinline__ float to_f32(f16 v) {
  float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v.x)); return f;
}

template <typename T> __device__ __forceinline__ T from_f32(float v);
template <> __device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ bf16 from_f32<bf16>(float v) {
  bf16 r; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r.x) : "f"(v)); return r;
}
template <> __device__ __forceinline__ f16 from_f32<f16>(float v) {
  f16 r; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r.x) : "f"(v)); return r;
}

// Eight consecutive elements as one 16-byte (two for float) vector.
template <typename T> struct Vec8 {
  uint4 raw;
  __device__ __forceinline__ void load(const T* p) { raw = *reinterpret_cast<const uint4*>(p); }
  __device__ __forceinline__ void store(T* p) const { *reinterpret_cast<uint4*>(p) = raw; }
  __device__ __forceinline__ void to_float(float* f) const {
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int i = 0; i < 8; i++) f[i] = to_f32(e[i]);
  }
  __device__ __forceinline__ void from_float(const float* f) {
    T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
    for (int i = 0; i < 8; i++) e[i] = from_f32<T>(f[i]);
  }
};
template <> struct Vec8<float> {
  uint4 raw[2];
  __device__ __forceinline__ void load(const float* p) {
    raw[0] = reinterpret_cast<const uint4*>(p)[0]; raw[1] = reinterpret_cast<const uint4*>(p)[1];
  }
  __device__ __forceinline__ void store(float* p) const {
    reinterpret_cast<uint4*>(p)[0] = raw[0]; reinterpret_cast<uint4*>(p)[1] = raw[1];
  }
  __device__ __forceinline__ void to_float(float* f) const {
    const float* e = reinterpret_cast<const float*>(raw);
#pragma unroll
    for (int i = 0; i < 8; i++) f[i] = e[i];
  }
  __device__ __forceinline__ void from_float(const float* f) {
    float* e = reinterpret_cast<float*>(raw);
#pragma unroll
    for (int i = 0; i < 8; i++) e[i] = f[i];
  }
};

// float8_e4m3fn (KV caches): exact decode; encode rounds to nearest even and saturates to
// +-448 (the NumPy reference gives NaN past 464, so only out-of-range values differ).
struct fp8 { unsigned char x; };
__device__ __forceinline__ float to_f32(fp8 v) {
  u32 s = (u32)(v.x & 0x80) << 24, e = (v.x >> 3) & 15, m = v.x & 7;
  if (e == 15 && m == 7) return __uint_as_float(s | 0x7fc00000u);
  if (e == 0) { float f = (float)m * 0.001953125f; return s ? -f : f; }
  return __uint_as_float(s | ((e + 120) << 23) | (m << 20));
}
template <> __device__ __forceinline__ fp8 from_f32<fp8>(float v) {
  fp8 r;
#if __CUDA_ARCH__ >= 890
  unsigned short p;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(p) : "f"(0.f), "f"(v));
  r.x = (unsigned char)(p & 0xff);
#else
  u32 bits = __float_as_uint(v), s = (bits >> 24) & 0x80;
  float a = fminf(fabsf(v), 448.f);
  if (v != v) { r.x = (unsigned char)(s | 0x7f); return r; }
  if (a < 0.015625f) { r.x = (unsigned char)(s | __float2int_rn(a * 512.f)); return r; }
  u32 b = __float_as_uint(a), mant = b & 0x7fffff, rem = mant & 0xfffff;
  u32 q = ((((b >> 23) & 0xff) - 120) << 3) | (mant >> 20);
  if (rem > 0x80000u || (rem == 0x80000u && (q & 1))) q++;
  r.x = (unsigned char)(s | (q > 0x7e ? 0x7e : q));
#endif
  return r;
}
template <> struct Vec8<fp8> {
  uint2 raw;
  __device__ __forceinline__ void load(const fp8* p) { raw = *reinterpret_cast<const uint2*>(p); }
  __device__ __forceinline__ void store(fp8* p) const { *reinterpret_cast<uint2*>(p) = raw; }
  __device__ __forceinline__ void to_float(float* f) const {
    const fp8* e = reinterpret_cast<const fp8*>(&raw);
#pragma unroll
    for (int i = 0; i < 8; i++) f[i] = to_f32(e[i]);
  }
  __device__ __forceinline__ void from_float(const float* f) {
    fp8* e = reinterpret_cast<fp8*>(&raw);
#pragma unroll
    for (int i = 0; i < 8; i++) e[i] = from_f32<fp8>(f[i]);
  }
};

__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Launch timeline for scripts/decode_timeline.py: built only with ATLAS_CUDA_NVRTC_DEFINES=
// ATLAS_TRACE (a separate cache entry). Thread 0 of block (0, 0, 0) of every launch records
// {grid id, time it reached pdl_wait, time the wait returned, grid shape} in slot
// grid id % ATLAS_TRACE_SLOTS of the module's atlas_trace array; the next launch's wait return
// is this one's end, so the timeline shows what each kernel adds to the step in the graph.
#ifdef ATLAS_TRACE
#define ATLAS_TRACE_SLOTS 8192
__device__ unsigned long long atlas_trace[ATLAS_TRACE_SLOTS * 4];
#endif

// Programmatic dependent launch (sm_90+). A kernel launched with PDL may start while the
// previous one drains; pdl_wait() returns once that kernel's writes are visible (a no-op for
// ordinary launches). pdl_trigger() lets the next PDL kernel start launching early.
__device__ __forceinline__ void pdl_wait() {
#ifdef ATLAS_TRACE
  unsigned long long t0 = global_ns();
#endif
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
#ifdef ATLAS_TRACE
  if (threadIdx.x == 0 && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0) {
    unsigned long long t1 = global_ns(), g;
    asm volatile("mov.u64 %0, %%gridid;" : "=l"(g));
    unsigned long long* r = atlas_trace + (g % ATLAS_TRACE_SLOTS) * 4;
    r[0] = g;
    r[1] = t0;
    r[2] = t1;
    r[3] = gridDim.x | ((unsigned long long)gridDim.y << 21) | ((unsigned long long)gridDim.z << 42);
  }
#endif
}
// Hint L2 to fetch [p, p + bytes) (16-byte aligned, bytes a multiple of 16): one bulk prefetch
// on sm_90+, else a line at a time.
__device__ __forceinline__ void prefetch_l2_range(const void* p, unsigned bytes) {
#if __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" :: "l"(p), "r"(bytes) : "memory");
#else
  for (unsigned o = 0; o < bytes; o += 128)
    asm volatile("prefetch.global.L2 [%0];\n" :: "l"((const char*)p + o));
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// Phase timestamps for scripts/kernel_phases.py: built only with ATLAS_CUDA_NVRTC_DEFINES=
// ATLAS_PROFILE (a separate cache entry); thread 0 of each of the first 2,048 blocks (linear
// index over x, y, z) writes the global timer (ns) into slot i (< 8) of its row of the module's
// atlas_profile array. A no-op in normal builds.
#ifdef ATLAS_PROFILE
__device__ unsigned long long atlas_profile[2048 * 8];
__device__ __forceinline__ void profile_stamp(int i) {
  unsigned b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);  // linear block
  if (threadIdx.x == 0 && b < 2048) atlas_profile[b * 8 + i] = global_ns();
}
#else
__device__ __forceinline__ void profile_stamp(int) {}
#endif

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// The gated-MLP activations (rounded to the storage type by the caller where the ops do).
__device__ __forceinline__ float silu(float x) { return x / (1.f + __expf(-x)); }
__device__ __forceinline__ float gelu_tanh(float x) {
  return 0.5f * x * (1.f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
}
__device__ __forceinline__ float gated_act(float x, int gelu) {
  return gelu ? gelu_tanh(x) : silu(x);
}

// Sum over the block; every thread gets the result. `scratch` holds >= 32 floats.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < nwarps ? scratch[lane] : 0.f;
  return warp_sum(v);
}
__device__ __forceinline__ float block_max(float v, float* scratch) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < nwarps ? scratch[lane] : NEG_INF;
  return warp_max(v);
}

// Largest (value, index) over the block, lowest index first on ties.
__device__ __forceinline__ void argmax_pair(float& v, int& i, float ov, int oi) {
  if (ov > v || (ov == v && oi < i)) { v = ov; i = oi; }
}
__device__ __forceinline__ void block_argmax(float& v, int& i, float* sv, int* si) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    argmax_pair(v, i, __shfl_xor_sync(0xffffffffu, v, o), __shfl_xor_sync(0xffffffffu, i, o));
  __syncthreads();
  if (lane == 0) { sv[warp] = v; si[warp] = i; }
  __syncthreads();
  v = lane < nwarps ? sv[lane] : NEG_INF;
  i = lane < nwarps ? si[lane] : 0x7fffffff;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    argmax_pair(v, i, __shfl_xor_sync(0xffffffffu, v, o), __shfl_xor_sync(0xffffffffu, i, o));
}

// Each .cu file is compiled once per activation dtype: -DATLAS_T=<type> -DATLAS_S=<suffix>
// (bf16/bf16, f16/f16, float/f32); ATLAS_MMA is 1 where tensor-core kernels exist.
#ifndef ATLAS_T
#define ATLAS_T bf16
#define ATLAS_S bf16
#endif
#ifndef ATLAS_MMA
#define ATLAS_MMA 0
#endif
#define INSTANTIATE_(M, T, S) M(T, S)
#define INSTANTIATE(M) INSTANTIATE_(M, ATLAS_T, ATLAS_S)
