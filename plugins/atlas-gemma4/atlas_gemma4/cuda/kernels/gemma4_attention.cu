// atlas-gemma4: sliding_window_attention (reference atlas_gemma4.ops.sliding_window_attention)
// over the paged KV cache: query position p sees keys max(0, p - window + 1) .. p (window <= 0:
// the whole causal context, Gemma-4's 512-wide full-attention heads). Only the blocks holding
// those keys are read, so the engine may have freed the blocks before a sequence's window.
//
// swa_split: a block per (query token, kv head x head chunk, split); lane groups of LPK lanes
//   score one key each, EPL dimensions a lane; decode rows and short chunks. With splits > 1
//   each block leaves its online-softmax partials and the last to finish merges them.
// swa_tile: a block per (16 (token, head) rows of one sequence, kv head x head chunk); K/V
//   tiles of BK keys in shared memory serve all 16 rows; prefill chunks in float32 or at small
//   head sizes.
// swa_mma (gemma4_attention_mma.cu): swa_tile on tensor cores in bf16 / f16.
#include "gemma4_attention.cuh"
// dec_last_split / dec_combine: atlas-cuda's split decode attention
#include "attention_decode.cuh"

template <int D>
struct SwaLanes {
  static constexpr int EPL = D >= 512 ? 16 : 8;
  static constexpr int LPK = D / EPL;
  static constexpr int KPW = 32 / LPK;
  static constexpr int NG = 4 * KPW;
};

template <typename T, int D, int HB>
__device__ void swa_split_impl(T* out, float* part_acc, float* part_ml, int* counters, const T* q,
                               const T* kc, const T* vc, const int* block_tables,
                               const int* seq_lens, const int* cu_q, SwaArgs a) {
  using L = SwaLanes<D>;
  constexpr int EPL = L::EPL, LPK = L::LPK, NG = L::NG;
  __shared__ float sm_acc[NG][HB][D];
  __shared__ float sm_m[NG][HB], sm_l[NG][HB];
  pdl_trigger();  // launched with PDL (decode): the rows of q come from the kernel before
  pdl_wait();
  int t = blockIdx.x, split = blockIdx.z, S = a.num_splits;
  int lane = threadIdx.x & 31, dl = lane % LPK, g = (threadIdx.x >> 5) * L::KPW + lane / LPK;
  int H = a.num_heads, KH = a.num_kv_heads, chunks = H / KH / HB;
  int kh = blockIdx.y / chunks, h0 = kh * (H / KH) + (blockIdx.y % chunks) * HB;
  int b = find_seq(cu_q, a.num_seqs, t);
  int pos = seq_lens[b] - (cu_q[b + 1] - cu_q[b]) + (t - cu_q[b]);
  int lo = swa_first(pos, a.window);
  int chunk = (pos + 1 - lo + S - 1) / S;
  chunk = (chunk + NG - 1) / NG * NG;
  int start = lo + split * chunk, end = min(start + chunk, pos + 1);
  const int* bt_row = block_tables + (long long)b * a.max_blocks;
  // U keys a group per round; the cache rows (block-table entries) of the next round load
  // while this round's K/V do, so a round waits on one memory round trip, not two.
  constexpr int U = 2;
  long long row[U];
#pragma unroll
  for (int u = 0; u < U; u++) {
    int j = start + u * NG + g;
    row[u] = j < end ? swa_row(bt_row, j, a.block_size, KH, kh) : -1;
  }
  float qf[HB][EPL], acc[HB][EPL], m[HB], l[HB];
#pragma unroll
  for (int hh = 0; hh < HB; hh++) {
    swa_load<T, EPL>(qf[hh], q + ((long long)t * H + h0 + hh) * D + dl * EPL);
#pragma unroll
    for (int e = 0; e < EPL; e++) { qf[hh][e] *= a.scale_log2; acc[hh][e] = 0.f; }
    m[hh] = NEG_INF;
    l[hh] = 0.f;
  }
  for (int base = start; base < end; base += U * NG) {
    float kf[U][EPL], vf[U][EPL];
    bool valid[U];
#pragma unroll
    for (int u = 0; u < U; u++) {
      valid[u] = row[u] >= 0;
      if (valid[u]) {
        swa_load<T, EPL>(kf[u], kc + row[u] * D + dl * EPL);
        swa_load<T, EPL>(vf[u], vc + row[u] * D + dl * EPL);
      } else {
#pragma unroll
        for (int e = 0; e < EPL; e++) { kf[u][e] = 0.f; vf[u][e] = 0.f; }
      }
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
      int j = base + (U + u) * NG + g;
      row[u] = j < end ? swa_row(bt_row, j, a.block_size, KH, kh) : -1;
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
#pragma unroll
      for (int hh = 0; hh < HB; hh++) {
        float s = 0.f;
#pragma unroll
        for (int e = 0; e < EPL; e++) s += qf[hh][e] * kf[u][e];
#pragma unroll
        for (int o = LPK / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (!valid[u]) continue;
        float mn = fmaxf(m[hh], s), corr = exp2f(m[hh] - mn), p = exp2f(s - mn);
        l[hh] = l[hh] * corr + p;
#pragma unroll
        for (int e = 0; e < EPL; e++) acc[hh][e] = acc[hh][e] * corr + p * vf[u][e];
        m[hh] = mn;
      }
    }
  }
#pragma unroll
  for (int hh = 0; hh < HB; hh++) {
#pragma unroll
    for (int e = 0; e < EPL; e++) sm_acc[g][hh][dl * EPL + e] = acc[hh][e];
    if (dl == 0) { sm_m[g][hh] = m[hh]; sm_l[g][hh] = l[hh]; }
  }
  __syncthreads();
  long long th0 = (long long)t * H + h0;
  for (int idx = threadIdx.x; idx < HB * D; idx += blockDim.x) {
    int hh = idx / D, d = idx % D;
    float mx, sum, A;
    attn_group_merge<NG, HB, D>(sm_acc, sm_m, sm_l, hh, d, mx, sum, A);
    long long th = th0 + hh;
    if (S == 1) {
      out[th * D + d] = from_f32<T>(sum > 0.f ? A / sum : 0.f);
    } else {
      part_acc[(th * S + split) * D + d] = A;
      if (d == 0) {
        part_ml[(th * S + split) * 2] = mx;
        part_ml[(th * S + split) * 2 + 1] = sum;
      }
    }
  }
  // Every split block writes its partials (an empty span leaves max -inf, sum 0); the last
  // of a (token, head chunk) to finish merges them (the core's dec_combine) and resets its
  // counter, so no second kernel runs.
  if (S == 1 || !dec_last_split(counters, t, S)) return;
  dec_combine<T, D, HB>(out, part_acc, part_ml, th0, S, S, 1.f);
}

// Shapes of swa_tile: R (token, head) rows a block, BK keys a tile; 8 threads score a row,
// warp w accumulates rows 4w .. 4w + 3 over DPL columns a lane.
template <int D>
struct SwaTile {
  static constexpr int R = 16;
  static constexpr int BK = D >= 512 ? 16 : 32;
  static constexpr int QP = D + 1;
  static constexpr int CPT = BK / 8;
  static constexpr int DPL = (D + 31) / 32;
  static constexpr int SMEM = 4 * (R * QP + BK * QP + BK * D + R * BK + 2 * R);
};

template <typename T, int D, int HB>
__device__ void swa_tile_impl(T* out, const T* q, const T* kc, const T* vc,
                              const int* block_tables, const int* seq_lens, const int* cu_q,
                              SwaArgs a) {
  using P = SwaTile<D>;
  constexpr int R = P::R, BK = P::BK, QP = P::QP, BT = R / HB;
  extern __shared__ float swa_smem[];
  float* sQ = swa_smem;
  float* sK = sQ + R * QP;
  float* sV = sK + BK * QP;
  float* sP = sV + BK * D;
  float* sCorr = sP + R * BK;
  float* sL = sCorr + R;
  int b, t0;
  if (!swa_tile_of(cu_q, a.num_seqs, blockIdx.x, BT, b, t0)) return;
  int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  int H = a.num_heads, KH = a.num_kv_heads, chunks = H / KH / HB;
  int kh = blockIdx.y / chunks, h0 = kh * (H / KH) + (blockIdx.y % chunks) * HB;
  int t_end = cu_q[b + 1], first_pos = seq_lens[b] - (t_end - cu_q[b]);
  int p0 = first_pos + (t0 - cu_q[b]), p1 = first_pos + (min(t0 + BT, t_end) - 1 - cu_q[b]);
  int lo = swa_first(p0, a.window), hi = p1 + 1;
  const int* bt_row = block_tables + (long long)b * a.max_blocks;
  for (int idx = tid; idx < R * D; idx += blockDim.x) {
    int r = idx / D, e = idx % D, t = t0 + r / HB;
    sQ[r * QP + e] = t < t_end ? to_f32(q[((long long)t * H + h0 + r % HB) * D + e]) * a.scale_log2
                               : 0.f;
  }
  int rs = tid >> 3, cs = tid & 7;
  bool row_ok = t0 + rs / HB < t_end;
  int pos = p0 + rs / HB, first = swa_first(pos, a.window);
  float m_r = NEG_INF, l_r = 0.f;
  float o[4][P::DPL];
#pragma unroll
  for (int rr = 0; rr < 4; rr++)
#pragma unroll
    for (int k = 0; k < P::DPL; k++) o[rr][k] = 0.f;
  for (int k0 = lo; k0 < hi; k0 += BK) {
    __syncthreads();
    for (int idx = tid; idx < BK * D / 8; idx += blockDim.x) {
      int c = idx / (D / 8), e = (idx % (D / 8)) * 8, j = k0 + c;
      float kf[8], vf[8];
      if (j < hi) {
        long long row = swa_row(bt_row, j, a.block_size, KH, kh);
        swa_load<T, 8>(kf, kc + row * D + e);
        swa_load<T, 8>(vf, vc + row * D + e);
      } else {
#pragma unroll
        for (int x = 0; x < 8; x++) { kf[x] = 0.f; vf[x] = 0.f; }
      }
#pragma unroll
      for (int x = 0; x < 8; x++) {
        sK[c * QP + e + x] = kf[x];
        sV[c * D + e + x] = vf[x];
      }
    }
    __syncthreads();
    float s[P::CPT], tmax = NEG_INF;
    const float* qr = sQ + rs * QP;
#pragma unroll
    for (int u = 0; u < P::CPT; u++) s[u] = 0.f;
#pragma unroll 4
    for (int e = 0; e < D; e++) {
      float qe = qr[e];
#pragma unroll
      for (int u = 0; u < P::CPT; u++) s[u] += qe * sK[(cs + 8 * u) * QP + e];
    }
#pragma unroll
    for (int u = 0; u < P::CPT; u++) {
      int j = k0 + cs + 8 * u;
      s[u] = row_ok && j < hi && j <= pos && j >= first ? s[u] : NEG_INF;
      tmax = fmaxf(tmax, s[u]);
    }
#pragma unroll
    for (int o2 = 4; o2 > 0; o2 >>= 1) tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, o2));
    float mn = fmaxf(m_r, tmax), psum = 0.f;
    float corr = mn == NEG_INF ? 1.f : exp2f(m_r - mn);
#pragma unroll
    for (int u = 0; u < P::CPT; u++) {
      float p = s[u] == NEG_INF ? 0.f : exp2f(s[u] - mn);
      sP[rs * BK + cs + 8 * u] = p;
      psum += p;
    }
#pragma unroll
    for (int o2 = 4; o2 > 0; o2 >>= 1) psum += __shfl_xor_sync(0xffffffffu, psum, o2);
    l_r = l_r * corr + psum;
    m_r = mn;
    if (cs == 0) sCorr[rs] = corr;
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < 4; rr++) {
      float cr = sCorr[warp * 4 + rr];
#pragma unroll
      for (int k = 0; k < P::DPL; k++) o[rr][k] *= cr;
    }
    for (int c = 0; c < BK; c++) {
      float v[P::DPL];
#pragma unroll
      for (int k = 0; k < P::DPL; k++) {
        int d = lane + 32 * k;
        v[k] = d < D ? sV[c * D + d] : 0.f;
      }
#pragma unroll
      for (int rr = 0; rr < 4; rr++) {
        float p = sP[(warp * 4 + rr) * BK + c];
#pragma unroll
        for (int k = 0; k < P::DPL; k++) o[rr][k] += p * v[k];
      }
    }
  }
  if (cs == 0) sL[rs] = l_r;
  __syncthreads();
#pragma unroll
  for (int rr = 0; rr < 4; rr++) {
    int r = warp * 4 + rr, t = t0 + r / HB;
    if (t >= t_end) continue;
    float L = sL[r], f = L > 0.f ? 1.f / L : 0.f;
    T* dst = out + ((long long)t * H + h0 + r % HB) * D;
#pragma unroll
    for (int k = 0; k < P::DPL; k++) {
      int d = lane + 32 * k;
      if (d < D) dst[d] = from_f32<T>(o[rr][k] * f);
    }
  }
}

#define SWA_SPLIT(T, S, D, HB)                                                                \
  extern "C" __global__ void __launch_bounds__(128) swa_split_##S##_d##D##_h##HB(            \
      T* out, float* pa, float* pm, int* cnt, const T* q, const T* k, const T* v,             \
      const int* bt, const int* sl, const int* cu, int H, int KH, int bs, int mb, int ns,     \
      int nsp, int win, float sc) {                                                           \
    SWA_ARGS;                                                                                 \
    swa_split_impl<T, D, HB>(out, pa, pm, cnt, q, k, v, bt, sl, cu, a);                       \
  }
#define SWA_TILE(T, S, D, HB)                                                                 \
  extern "C" __global__ void __launch_bounds__(128) swa_tile_##S##_d##D##_h##HB(             \
      T* out, const T* q, const T* k, const T* v, const int* bt, const int* sl,               \
      const int* cu, int H, int KH, int bs, int mb, int ns, int nsp, int win, float sc) {      \
    SWA_ARGS;                                                                                 \
    swa_tile_impl<T, D, HB>(out, q, k, v, bt, sl, cu, a);                                     \
  }
#define SWA_D(T, S, D)                                                                        \
  SWA_SPLIT(T, S, D, 1) SWA_SPLIT(T, S, D, 2) SWA_TILE(T, S, D, 1) SWA_TILE(T, S, D, 2)       \
  SWA_TILE(T, S, D, 4) SWA_TILE(T, S, D, 8)
#define SWA(T, S)                                                                             \
  SWA_D(T, S, 16) SWA_D(T, S, 32) SWA_D(T, S, 64) SWA_D(T, S, 128) SWA_D(T, S, 256)           \
  SWA_D(T, S, 512) SWA_SPLIT(T, S, 16, 4) SWA_SPLIT(T, S, 32, 4) SWA_SPLIT(T, S, 64, 4)       \
  SWA_SPLIT(T, S, 128, 4) SWA_SPLIT(T, S, 256, 4)
INSTANTIATE(SWA)
