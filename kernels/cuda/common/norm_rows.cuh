// The RMSNorm prologue of the fused decode kernels (gemv_norm.cu, moe_block.cu): every block
// normalises the few rows it needs into shared memory itself instead of waiting for an
// rms_norm kernel.
#pragma once
// Needs common.cuh included before it (the NVRTC inliner has no include guards).

// Chunks of 8 elements each thread holds at once in the one-pass prologue: K <= 8 * NORM_KC *
// blockDim.x (8,192 for 256 threads) takes one L2 round trip per row.
#define NORM_KC 4

// The norm weight's chunks of this thread, loaded before the PDL wait (the weight is static),
// so the prologue after the wait reads only x and the residual.
template <typename T>
struct NormWeight {
  Vec8<T> w[NORM_KC];
};
template <typename T>
__device__ __forceinline__ void norm_weight_preload(NormWeight<T>& p, const T* nw, int K) {
#pragma unroll
  for (int c = 0; c < NORM_KC; c++) {
    int i = (threadIdx.x + c * blockDim.x) * 8;
    if (i < K) p.w[c].load(nw + i);
  }
}

// NORM2's first norm: the row's x chunks (a) RMS-normalised with their own weight's chunks (xw,
// loaded with x after the PDL wait: one L2 round trip) into v, rounded to T as rms_norm stores
// them (a block_sum of its own). a stays packed through the block_sum (as floats there, or xw
// loaded after it: gemvn_norm2_act_bf16_m1_g1 139-153 registers instead of 127).
template <typename T>
__device__ __forceinline__ void norm_x_own(float (&v)[NORM_KC][8], const Vec8<T> (&a)[NORM_KC],
                                           const Vec8<T> (&xw)[NORM_KC], float eps, int zc,
                                           int K, float* scratch) {
  float ss = 0.f;
#pragma unroll
  for (int c = 0; c < NORM_KC; c++) {
    if ((threadIdx.x + c * blockDim.x) * 8 >= K) continue;
    float f[8]; a[c].to_float(f);
#pragma unroll
    for (int j = 0; j < 8; j++) ss += f[j] * f[j];
  }
  float inv = rsqrtf(block_sum(ss, scratch) / K + eps);
#pragma unroll
  for (int c = 0; c < NORM_KC; c++) {
    if ((threadIdx.x + c * blockDim.x) * 8 >= K) continue;
    float wf[8]; xw[c].to_float(wf); a[c].to_float(v[c]);
#pragma unroll
    for (int j = 0; j < 8; j++)
      v[c][j] = to_f32(from_f32<T>(v[c][j] * inv * (zc ? wf[j] + 1.f : wf[j])));
  }
}

// Normalise rows m0 .. m0 + MT - 1 (those below M) of x (+ residual) into xs[MT][K] (T, rounded
// as rms_norm stores them). Block 0 also writes the residual sum (r_out) and, when h_out is
// given, the normed rows. With pre (the norm weight, preloaded) and K within one pass, a row's
// x and residual chunks are all loaded at once and kept in registers; otherwise two sweeps
// through shared memory.
// NORM2 (one pass only: pre and K <= 8 * NORM_KC * blockDim.x, else it traps): x is first
// normalised with its own weight xnw (rms_norm(x, xnw), norm_x_own), then added to the
// residual and normalised with nw as above; block 0 also writes rms_norm(x + residual, nw2)
// into h2_out when given (the same sum and inv, its own weight).
template <typename T, int MT, bool NORM2 = false>
__device__ void norm_rows_to_shared(T* xs, T* r_out, T* h_out, const T* x, const T* residual,
                                    const T* nw, float eps, int zc, int M, int K, int m0,
                                    const NormWeight<T>* pre = nullptr, const T* xnw = nullptr,
                                    T* h2_out = nullptr, const T* nw2 = nullptr) {
  __shared__ float scratch[32];
  if constexpr (NORM2) {
    if (K > NORM_KC * 8 * (int)blockDim.x) __trap();
  }
  if (pre && K <= NORM_KC * 8 * (int)blockDim.x) {
    for (int m = 0; m < MT && m0 + m < M; m++) {
      long long row = (long long)(m0 + m) * K;
      Vec8<T> a[NORM_KC], b[NORM_KC], xw[NORM_KC];
#pragma unroll
      for (int c = 0; c < NORM_KC; c++) {
        int i = (threadIdx.x + c * blockDim.x) * 8;
        if (i < K) {
          a[c].load(x + row + i);
          if (residual) b[c].load(residual + row + i);
          if constexpr (NORM2) xw[c].load(xnw + i);
        }
      }
      float v[NORM_KC][8], ss = 0.f;
      if constexpr (NORM2) norm_x_own<T>(v, a, xw, eps, zc, K, scratch);
#pragma unroll
      for (int c = 0; c < NORM_KC; c++) {
        int i = (threadIdx.x + c * blockDim.x) * 8;
        if (i >= K) continue;
        if constexpr (!NORM2) a[c].to_float(v[c]);
        if (residual) {
          float f[8]; b[c].to_float(f);
#pragma unroll
          for (int j = 0; j < 8; j++) v[c][j] = to_f32(from_f32<T>(v[c][j] + f[j]));
          Vec8<T> o; o.from_float(v[c]);
          if (blockIdx.x == 0) o.store(r_out + row + i);
        }
#pragma unroll
        for (int j = 0; j < 8; j++) ss += v[c][j] * v[c][j];
      }
      float inv = rsqrtf(block_sum(ss, scratch) / K + eps);
#pragma unroll
      for (int c = 0; c < NORM_KC; c++) {
        int i = (threadIdx.x + c * blockDim.x) * 8;
        if (i >= K) continue;
        float wf[8]; pre->w[c].to_float(wf);
        if constexpr (NORM2) {
          if (h2_out && blockIdx.x == 0) {
            float w2[8], u[8]; Vec8<T> o2; o2.load(nw2 + i); o2.to_float(w2);
#pragma unroll
            for (int j = 0; j < 8; j++) u[j] = v[c][j] * inv * (zc ? w2[j] + 1.f : w2[j]);
            o2.from_float(u); o2.store(h2_out + row + i);
          }
        }
#pragma unroll
        for (int j = 0; j < 8; j++) v[c][j] = v[c][j] * inv * (zc ? wf[j] + 1.f : wf[j]);
        Vec8<T> o; o.from_float(v[c]); o.store(xs + m * K + i);
        if (h_out && blockIdx.x == 0) o.store(h_out + row + i);
      }
    }
    __syncthreads();
    return;
  }
  for (int m = 0; m < MT && m0 + m < M; m++) {
    long long row = (long long)(m0 + m) * K;
    float ss = 0.f;
    for (int i = threadIdx.x * 8; i < K; i += blockDim.x * 8) {
      float v[8]; Vec8<T> a; a.load(x + row + i); a.to_float(v);
      if (residual) {
        float b[8]; Vec8<T> bv; bv.load(residual + row + i); bv.to_float(b);
#pragma unroll
        for (int j = 0; j < 8; j++) v[j] = to_f32(from_f32<T>(v[j] + b[j]));
        Vec8<T> o; o.from_float(v);
        if (blockIdx.x == 0) o.store(r_out + row + i);
      }
#pragma unroll
      for (int j = 0; j < 8; j++) ss += v[j] * v[j];
      Vec8<T> o; o.from_float(v); o.store(xs + m * K + i);
    }
    float inv = rsqrtf(block_sum(ss, scratch) / K + eps);
    for (int i = threadIdx.x * 8; i < K; i += blockDim.x * 8) {
      float v[8], wf[8]; Vec8<T> a, wv; a.load(xs + m * K + i); a.to_float(v);
      wv.load(nw + i); wv.to_float(wf);
#pragma unroll
      for (int j = 0; j < 8; j++) v[j] = v[j] * inv * (zc ? wf[j] + 1.f : wf[j]);
      a.from_float(v); a.store(xs + m * K + i);
      if (h_out && blockIdx.x == 0) a.store(h_out + row + i);
    }
  }
  __syncthreads();
}
