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

// Normalise rows m0 .. m0 + MT - 1 (those below M) of x (+ residual) into xs[MT][K] (T, rounded
// as rms_norm stores them). Block 0 also writes the residual sum (r_out) and, when h_out is
// given, the normed rows. With pre (the norm weight, preloaded) and K within one pass, a row's
// x and residual chunks are all loaded at once and kept in registers; otherwise two sweeps
// through shared memory.
template <typename T, int MT>
__device__ void norm_rows_to_shared(T* xs, T* r_out, T* h_out, const T* x, const T* residual,
                                    const T* nw, float eps, int zc, int M, int K, int m0,
                                    const NormWeight<T>* pre = nullptr) {
  __shared__ float scratch[32];
  if (pre && K <= NORM_KC * 8 * (int)blockDim.x) {
    for (int m = 0; m < MT && m0 + m < M; m++) {
      long long row = (long long)(m0 + m) * K;
      Vec8<T> a[NORM_KC], b[NORM_KC];
#pragma unroll
      for (int c = 0; c < NORM_KC; c++) {
        int i = (threadIdx.x + c * blockDim.x) * 8;
        if (i < K) {
          a[c].load(x + row + i);
          if (residual) b[c].load(residual + row + i);
        }
      }
      float v[NORM_KC][8], ss = 0.f;
#pragma unroll
      for (int c = 0; c < NORM_KC; c++) {
        int i = (threadIdx.x + c * blockDim.x) * 8;
        if (i >= K) continue;
        a[c].to_float(v[c]);
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
