// atlas-qwen3vl: the vision-tower ops (references in atlas_qwen3vl.vision_reference). Float32
// arithmetic, results stored in the activation type T.
//   layer_norm:  a block per row, two passes (mean, then the centred variance).
//   gelu:        elementwise, exact (erf) or tanh form.
//   interp_pos:  a block per patch, 4 bilinear taps of the learned position table.
//   vision_attn: (float32) a block per (token, head); each warp walks a strided share of the
//                keys of the token's image with its own online softmax (lanes split head_dim,
//                at most 128), the warps' partials merged at the end. q and k are rotated on
//                the fly (NeoX halves, per-token cos/sin rows) and rounded to T as the
//                reference does.
//   rope_pad:    (bf16/f16, before the core flash attention) a block per token: q and k rotated
//                and rounded as above, v copied, each head zero-padded from D to Dp columns
//                (zeros in q and k leave the scores as they are).
//   unpad_heads: the attention output [t, H, Dp] back to [t, H * D].
#include "common.cuh"

#define VA_WARPS 4
#define VA_MAX_D 128

template <typename T>
__device__ void layer_norm_impl(T* out, const T* x, const T* w, const T* b, int cols, float eps) {
  __shared__ float scratch[32];
  const T* row = x + (long long)blockIdx.x * cols;
  T* dst = out + (long long)blockIdx.x * cols;
  float s = 0.f;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) s += to_f32(row[c]);
  float mean = block_sum(s, scratch) / cols;
  float v = 0.f;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) {
    float d = to_f32(row[c]) - mean;
    v += d * d;
  }
  float inv = rsqrtf(block_sum(v, scratch) / cols + eps);
  for (int c = threadIdx.x; c < cols; c += blockDim.x)
    dst[c] = from_f32<T>((to_f32(row[c]) - mean) * inv * to_f32(w[c]) + to_f32(b[c]));
}

template <typename T>
__device__ void gelu_impl(T* out, const T* x, long long n, int tanh_form) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x) {
    float v = to_f32(x[i]);
    float exact = 0.5f * v * (1.f + erff(v * 0.7071067811865476f));
    out[i] = from_f32<T>(tanh_form ? gelu_tanh(v) : exact);
  }
}

template <typename T>
__device__ void interp_pos_impl(T* out, const T* table, const int* idx, const float* wt,
                                int hidden) {
  long long i = blockIdx.x;
  for (int c = threadIdx.x; c < hidden; c += blockDim.x) {
    float s = 0.f;
#pragma unroll
    for (int j = 0; j < 4; j++)
      s += wt[i * 4 + j] * to_f32(table[(long long)idx[i * 4 + j] * hidden + c]);
    out[i * hidden + c] = from_f32<T>(s);
  }
}

// Element d of a head of `src` rotated by row `cs` ([cos half | sin half]) and rounded to T.
template <typename T>
__device__ __forceinline__ float rotated(const T* src, const float* cs, int d, int D) {
  int half = D >> 1, f = d < half ? d : d - half;
  float other = d < half ? -to_f32(src[d + half]) : to_f32(src[d - half]);
  return to_f32(from_f32<T>(to_f32(src[d]) * cs[f] + other * cs[half + f]));
}

template <typename T>
__device__ void vision_attn_impl(T* out, const T* qkv, const float* cos_sin, const int* cu,
                                 int n_img, int H, int D, float scale) {
  __shared__ float q_s[VA_MAX_D];
  __shared__ float m_w[VA_WARPS], l_w[VA_WARPS], acc_w[VA_WARPS][VA_MAX_D];
  int t = blockIdx.x, h = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  long long stride = 3LL * H * D;
  int start = 0, end = 0;
  for (int b = 0; b < n_img; b++)
    if (t >= cu[b] && t < cu[b + 1]) { start = cu[b]; end = cu[b + 1]; }
  for (int d = threadIdx.x; d < D; d += blockDim.x)
    q_s[d] = rotated(qkv + t * stride + (long long)h * D, cos_sin + (long long)t * D, d, D);
  __syncthreads();
  float m = NEG_INF, l = 0.f, acc[VA_MAX_D / 32];
#pragma unroll
  for (int i = 0; i < VA_MAX_D / 32; i++) acc[i] = 0.f;
  for (int j = start + warp; j < end; j += VA_WARPS) {
    const T* k = qkv + j * stride + (long long)(H + h) * D;
    const T* v = qkv + j * stride + (long long)(2 * H + h) * D;
    float dot = 0.f;
    for (int d = lane; d < D; d += 32) dot += q_s[d] * rotated(k, cos_sin + (long long)j * D, d, D);
    float s = warp_sum(dot) * scale;
    float m_new = fmaxf(m, s), corr = __expf(m - m_new), p = __expf(s - m_new);
    l = l * corr + p;
#pragma unroll
    for (int i = 0; i < VA_MAX_D / 32; i++) {
      int d = lane + 32 * i;
      acc[i] = acc[i] * corr + (d < D ? p * to_f32(v[d]) : 0.f);
    }
    m = m_new;
  }
  if (lane == 0) { m_w[warp] = m; l_w[warp] = l; }
#pragma unroll
  for (int i = 0; i < VA_MAX_D / 32; i++)
    if (lane + 32 * i < D) acc_w[warp][lane + 32 * i] = acc[i];
  __syncthreads();
  float mx = NEG_INF;
  for (int w = 0; w < VA_WARPS; w++) mx = fmaxf(mx, m_w[w]);
  float denom = 0.f;
  for (int w = 0; w < VA_WARPS; w++)
    if (m_w[w] != NEG_INF) denom += l_w[w] * __expf(m_w[w] - mx);
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float o = 0.f;
    for (int w = 0; w < VA_WARPS; w++)
      if (m_w[w] != NEG_INF) o += acc_w[w][d] * __expf(m_w[w] - mx);
    out[((long long)t * H + h) * D + d] = from_f32<T>(denom > 0.f ? o / denom : 0.f);
  }
}

template <typename T>
__device__ void rope_pad_impl(T* q, T* k, T* v, const T* qkv, const float* cos_sin, int H, int D,
                              int Dp) {
  long long t = blockIdx.x;
  const T* row = qkv + t * 3 * H * D;
  const float* cs = cos_sin + t * D;
  for (int i = threadIdx.x; i < 3 * H * Dp; i += blockDim.x) {
    int part = i / (H * Dp), hd = i % (H * Dp), h = hd / Dp, d = hd % Dp;
    const T* src = row + (part * H + h) * D;
    float x = 0.f;
    if (d < D) x = part == 2 ? to_f32(src[d]) : rotated(src, cs, d, D);
    T* dst = part == 0 ? q : part == 1 ? k : v;
    dst[t * H * Dp + hd] = from_f32<T>(x);
  }
}

template <typename T>
__device__ void unpad_heads_impl(T* out, const T* x, long long n, int D, int Dp) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x)
    out[i] = x[i / D * Dp + i % D];
}

#define VISION(T, S)                                                                          \
  extern "C" __global__ void layer_norm_##S(T* out, const T* x, const T* w, const T* b,       \
                                            int cols, float eps) {                            \
    layer_norm_impl<T>(out, x, w, b, cols, eps);                                              \
  }                                                                                           \
  extern "C" __global__ void gelu_##S(T* out, const T* x, long long n, int tanh_form) {      \
    gelu_impl<T>(out, x, n, tanh_form);                                                       \
  }                                                                                           \
  extern "C" __global__ void interp_pos_##S(T* out, const T* table, const int* idx,          \
                                            const float* wt, int hidden) {                    \
    interp_pos_impl<T>(out, table, idx, wt, hidden);                                          \
  }                                                                                           \
  extern "C" __global__ void __launch_bounds__(VA_WARPS * 32) vision_attn_##S(               \
      T* out, const T* qkv, const float* cs, const int* cu, int n_img, int H, int D,          \
      float scale) {                                                                          \
    vision_attn_impl<T>(out, qkv, cs, cu, n_img, H, D, scale);                                \
  }                                                                                           \
  extern "C" __global__ void rope_pad_##S(T* q, T* k, T* v, const T* qkv, const float* cs,   \
                                          int H, int D, int Dp) {                             \
    rope_pad_impl<T>(q, k, v, qkv, cs, H, D, Dp);                                             \
  }                                                                                           \
  extern "C" __global__ void unpad_heads_##S(T* out, const T* x, long long n, int D, int Dp) { \
    unpad_heads_impl<T>(out, x, n, D, Dp);                                                    \
  }
INSTANTIATE(VISION)
