// The RMSNorm prologue of the fused decode kernels (gemv_norm.cu, moe_block.cu): every block
// normalises the few rows it needs into shared memory itself instead of waiting for an
// rms_norm kernel.
#pragma once
// Needs common.cuh included before it (the NVRTC inliner has no include guards).

// Normalise rows m0 .. m0 + MT - 1 (those below M) of x (+ residual) into xs[MT][K] (T, rounded
// as rms_norm stores them). Block 0 also writes the residual sum (r_out) and, when h_out is
// given, the normed rows.
template <typename T, int MT>
__device__ void norm_rows_to_shared(T* xs, T* r_out, T* h_out, const T* x, const T* residual,
                                    const T* nw, float eps, int zc, int M, int K, int m0) {
  __shared__ float scratch[32];
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
