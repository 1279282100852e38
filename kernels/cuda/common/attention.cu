// Paged decode / chunked-prefill attention and dense causal prefill attention.
// Grid (query token, kv head x head chunk, split); each block scores one span of keys for HB
// query heads sharing one KV head (GQA: K/V read once per block). A key is handled by D/8 lanes
// (16-byte loads); per-lane online softmax, merged across lanes, warps and splits.
#include "attention_common.cuh"

template <typename T, typename C, int D, int HB>
__device__ void attn_impl(T* out, float* part_acc, float* part_ml, const T* q, const C* kb,
                          const C* vb, const int* block_tables, const int* seq_lens,
                          const int* cu_q, AttnArgs a) {
  constexpr int LPK = D / 8, KPW = 32 / LPK, NW = 4, NG = NW * KPW;
  __shared__ float sm_acc[NG][HB][D];
  __shared__ float sm_m[NG][HB], sm_l[NG][HB];
  pdl_trigger();
  int t = blockIdx.x, split = blockIdx.z;
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, sub = lane / LPK, dl = lane % LPK;
  int H = a.num_heads, KH = a.num_kv_heads, G = H / KH, chunks = G / HB;
  int kh = blockIdx.y / chunks, h0 = kh * G + (blockIdx.y % chunks) * HB;
  int b = find_seq(cu_q, a.num_seqs, t);
  int n_q = cu_q[b + 1] - cu_q[b], i = t - cu_q[b];
  bool PAGED = block_tables != 0;
  int pos = PAGED ? seq_lens[b] - n_q + i : i;
  int chunk = (pos + a.num_splits) / a.num_splits;  // the context split evenly, per query
  int start = split * chunk, end = min(start + chunk, pos + 1);

  float qf[HB][8], m[HB], l[HB], acc[HB][8];
#pragma unroll
  for (int hh = 0; hh < HB; hh++) {
    Vec8<T> qv; qv.load(q + ((long long)t * H + h0 + hh) * D + dl * 8); qv.to_float(qf[hh]);
#pragma unroll
    for (int e = 0; e < 8; e++) { qf[hh][e] *= a.scale_log2 * a.kv_scale; acc[hh][e] = 0.f; }
    m[hh] = NEG_INF; l[hh] = 0.f;
  }
  for (int base = start + warp * KPW; base < end; base += NW * KPW) {
    int j = base + sub;
    bool valid = j < end;
    float kf[8], vf[8];
    if (valid) {
      long long row;
      if (PAGED) {
        int blk = block_tables[(long long)b * a.max_blocks + j / a.block_size];
        row = ((long long)blk * a.block_size + j % a.block_size) * KH + kh;
      } else {
        row = (long long)(cu_q[b] + j) * KH + kh;
      }
      Vec8<C> kv, vv; kv.load(kb + row * D + dl * 8); vv.load(vb + row * D + dl * 8);
      kv.to_float(kf); vv.to_float(vf);
    } else {
#pragma unroll
      for (int e = 0; e < 8; e++) { kf[e] = 0.f; vf[e] = 0.f; }
    }
#pragma unroll
    for (int hh = 0; hh < HB; hh++) {
      float s = lane_group_dot(qf[hh], kf, LPK);
      if (valid) {
        float mn = fmaxf(m[hh], s), corr = exp2f(m[hh] - mn), p = exp2f(s - mn);
        l[hh] = l[hh] * corr + p;
#pragma unroll
        for (int e = 0; e < 8; e++) acc[hh][e] = acc[hh][e] * corr + p * vf[e];
        m[hh] = mn;
      }
    }
  }
  int g = warp * KPW + sub;
  attn_group_store<NG, HB, D>(sm_acc, sm_m, sm_l, g, dl, acc, m, l);
  attn_group_write<T, NG, HB, D>(out, part_acc, part_ml, sm_acc, sm_m, sm_l,
                                 (long long)t * H + h0, split, a.num_splits,
                                 a.num_splits == 1, a.kv_scale);
}

// Merge split partials: grid (num_tokens, num_heads), block >= 32 threads.
template <typename T>
__device__ void attn_combine_impl(T* out, const float* part_acc, const float* part_ml, int D,
                                  int S, float kv_scale) {
  pdl_trigger();
  long long th = (long long)blockIdx.x * gridDim.y + blockIdx.y;
  const float* ml = part_ml + th * S * 2;
  float mx = NEG_INF;
  for (int s = 0; s < S; s++) mx = fmaxf(mx, ml[s * 2]);
  float L = 0.f;
  for (int s = 0; s < S; s++) if (ml[s * 2] != NEG_INF) L += ml[s * 2 + 1] * exp2f(ml[s * 2] - mx);
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float A = 0.f;
    for (int s = 0; s < S; s++)
      if (ml[s * 2] != NEG_INF) A += part_acc[(th * S + s) * D + d] * exp2f(ml[s * 2] - mx);
    out[th * D + d] = from_f32<T>(L > 0.f ? A / L * kv_scale : 0.f);
  }
}

// attn[_fp8]_<dtype>_d<D>_h<HB>: _fp8 reads a float8_e4m3fn paged cache (head dims 64-256).
#define ATTN_ONE(T, S, D, HB, C, CS)                                                          \
  extern "C" __global__ void __launch_bounds__(128) attn##CS##_##S##_d##D##_h##HB(         \
      T* out, float* pa, float* pm, const T* q, const C* k, const C* v, const int* bt,        \
      const int* sl, const int* cu, int H, int KH, int bs, int mb, int ns, int nsp,           \
      float sc, float kvs) {                                                                  \
    AttnArgs a{H, KH, bs, mb, ns, nsp, sc, kvs};                                              \
    attn_impl<T, C, D, HB>(out, pa, pm, q, k, v, bt, sl, cu, a);                              \
  }
#define ATTN_HB(T, S, D, C, CS)                                                               \
  ATTN_ONE(T, S, D, 1, C, CS) ATTN_ONE(T, S, D, 2, C, CS) ATTN_ONE(T, S, D, 4, C, CS)         \
  ATTN_ONE(T, S, D, 8, C, CS)
#define ATTN(T, S)                                                                            \
  ATTN_HB(T, S, 16, T, ) ATTN_HB(T, S, 32, T, ) ATTN_HB(T, S, 64, T, )                        \
  ATTN_HB(T, S, 128, T, ) ATTN_HB(T, S, 256, T, )                                             \
  ATTN_HB(T, S, 64, fp8, _fp8) ATTN_HB(T, S, 128, fp8, _fp8) ATTN_HB(T, S, 256, fp8, _fp8)    \
  extern "C" __global__ void attn_combine_##S(T* out, const float* pa, const float* pm,       \
                                              int D, int nsp, float kvs) {                    \
    attn_combine_impl<T>(out, pa, pm, D, nsp, kvs);                                           \
  }
INSTANTIATE(ATTN)
