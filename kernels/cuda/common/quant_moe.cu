// Decode MoE experts with quantized stacks (W8A16 / W4A16; moe_experts for at most 8 tokens):
//   qmoe_gate_up_{fp8,nvfp4}_*  h[p, n] = act(gate_e(x[tok]))[n] * up_e(x[tok])[n] in f32 for
//                               every (token, slot) pair p = tok * k + j, e = ids[p]; grid
//                               (ceil(I / 8), pairs), a warp per column (its gate and up rows).
//   qmoe_down_{fp8,nvfp4}_*     out[tok, n] = sum_j weights[tok, j] * down_e(h[tok * k + j])[n];
//                               grid (ceil(H / 8), tokens), a warp per column.
// Only the chosen experts' rows are read, each with 16-byte loads dequantized in registers
// (quant_common.cuh); expert e's data, scales and global scale start at e times a stride.
// The expert ids come from the router kernel before, so nothing loads before the PDL wait.
// A pair of weight exactly 0 (expert parallelism: another rank's expert, id 0) reads nothing:
// gate_up leaves its h row unwritten and down skips the slot.
#include "common.cuh"
#include "quant_common.cuh"

// Warp-summed dot product of weight row n (of the current expert, `w` its first row) with K
// elements of `xr` (T or float).
template <int FMT, typename XT>
__device__ __forceinline__ float qmoe_dot(const unsigned char* w, const QScale& q, int n, int K,
                                          float g, const XT* xr) {
  constexpr int E = QChunk<FMT>::ELEMS;
  const unsigned char* row = w + (long long)n * (K / QChunk<FMT>::BYTES_PER_ROW_DIV);
  int lane = threadIdx.x & 31, chunks = K / E;
  float acc = 0.f;
  for (int c = lane; c < chunks; c += 32) {
    uint4 raw = *reinterpret_cast<const uint4*>(row + (long long)c * 16);
    float wf[E], s[E / 16];
    QChunk<FMT>::decode(raw, wf);
    QChunk<FMT>::scales(q, n, c * E, K, g, s);
#pragma unroll
    for (int gi = 0; gi < E / 16; gi++) {
      float part = 0.f;
#pragma unroll
      for (int h = 0; h < 2; h++) {
        float xf[8]; Vec8<XT> xv; xv.load(xr + c * E + 16 * gi + 8 * h); xv.to_float(xf);
#pragma unroll
        for (int j = 0; j < 8; j++) part += wf[16 * gi + 8 * h + j] * xf[j];
      }
      acc += s[gi] * part;
    }
  }
  return warp_sum(acc);
}

// Expert e's QScale: its scale block (fp8: s_lead floats; nvfp4: rows * K/16 bytes) and data.
template <int FMT>
__device__ __forceinline__ QScale qmoe_scale(const QScale& q, int e, int rows, int K,
                                             long long s_lead) {
  QScale r = q;
  if (FMT == 1)
    r.scale = reinterpret_cast<const unsigned char*>(q.scale) + (long long)e * rows * (K / 16);
  else
    r.scale = reinterpret_cast<const float*>(q.scale) + e * s_lead;
  return r;
}

template <typename T, int FMT>
__device__ void qmoe_gate_up_impl(float* h, const T* x, const unsigned char* w, QScale q,
                                  long long s_lead, const float* weights, const int* ids,
                                  int k, int H, int I, int gelu) {
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int n = blockIdx.x * 8 + warp, p = blockIdx.y, tok = p / k;
  pdl_trigger();
  pdl_wait();
  if (n >= I || weights[p] == 0.f) return;
  int e = ids[p];
  long long row_bytes = H / QChunk<FMT>::BYTES_PER_ROW_DIV;
  const unsigned char* we = w + (long long)e * 2 * I * row_bytes;
  QScale qe = qmoe_scale<FMT>(q, e, 2 * I, H, s_lead);
  float g = FMT == 1 ? q.gscale[e] : 1.f;
  const T* xr = x + (long long)tok * H;
  float gate = qmoe_dot<FMT, T>(we, qe, n, H, g, xr);
  float up = qmoe_dot<FMT, T>(we, qe, I + n, H, g, xr);
  if (lane == 0) h[(long long)p * I + n] = gated_act(gate, gelu) * up;
}

template <typename T, int FMT>
__device__ void qmoe_down_impl(T* out, const float* h, const unsigned char* w, QScale q,
                               long long s_lead, const float* weights, const int* ids, int k,
                               int H, int I) {
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int n = blockIdx.x * 8 + warp, tok = blockIdx.y;
  pdl_trigger();
  pdl_wait();
  if (n >= H) return;
  long long row_bytes = I / QChunk<FMT>::BYTES_PER_ROW_DIV;
  float acc = 0.f;
  for (int j = 0; j < k; j++) {
    int p = tok * k + j, e = ids[p];
    float wp = weights[p];
    if (wp == 0.f) continue;  // the same for the whole warp (p): qmoe_dot's warp_sum is safe
    QScale qe = qmoe_scale<FMT>(q, e, H, I, s_lead);
    float g = FMT == 1 ? q.gscale[e] : 1.f;
    acc += wp * qmoe_dot<FMT, float>(w + (long long)e * H * row_bytes, qe, n, I, g,
                                     h + (long long)p * I);
  }
  if (lane == 0) out[(long long)tok * H + n] = from_f32<T>(acc);
}

#define QMOE(T, S)                                                                            \
  extern "C" __global__ void __launch_bounds__(256) qmoe_gate_up_fp8_##S(                    \
      float* h, const T* x, const unsigned char* w, const float* scale, const float* weights, \
      const int* ids, int k, int H, int I, int gelu, int bn, int bk, int s_row,               \
      long long s_lead) {                                                                     \
    qmoe_gate_up_impl<T, 0>(h, x, w, QScale{scale, nullptr, bn, bk, s_row}, s_lead, weights, \
                            ids, k, H, I, gelu);                                              \
  }                                                                                           \
  extern "C" __global__ void __launch_bounds__(256) qmoe_gate_up_nvfp4_##S(                  \
      float* h, const T* x, const unsigned char* w, const unsigned char* scale,               \
      const float* gscale, const float* weights, const int* ids, int k, int H, int I,         \
      int gelu) {                                                                             \
    qmoe_gate_up_impl<T, 1>(h, x, w, QScale{scale, gscale, 1, 16, 0}, 0, weights, ids, k, H, \
                            I, gelu);                                                         \
  }                                                                                           \
  extern "C" __global__ void __launch_bounds__(256) qmoe_down_fp8_##S(                       \
      T* out, const float* h, const unsigned char* w, const float* scale,                     \
      const float* weights, const int* ids, int k, int H, int I, int bn, int bk, int s_row,   \
      long long s_lead) {                                                                     \
    qmoe_down_impl<T, 0>(out, h, w, QScale{scale, nullptr, bn, bk, s_row}, s_lead, weights,  \
                         ids, k, H, I);                                                       \
  }                                                                                           \
  extern "C" __global__ void __launch_bounds__(256) qmoe_down_nvfp4_##S(                     \
      T* out, const float* h, const unsigned char* w, const unsigned char* scale,             \
      const float* gscale, const float* weights, const int* ids, int k, int H, int I) {       \
    qmoe_down_impl<T, 1>(out, h, w, QScale{scale, gscale, 1, 16, 0}, 0, weights, ids, k, H,  \
                         I);                                                                  \
  }
INSTANTIATE(QMOE)
