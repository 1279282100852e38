// Paged decode / chunked-prefill attention with the split combine done in-kernel.
// Grid (query token, kv head x head chunk, split); a block scores one span of a query's keys
// for HB <= 4 query heads sharing one KV head. A lane group of D/8 lanes scores U keys a round
// while the next round's K/V loads are in flight (block-table entries one round further
// ahead). The span length is a multiple of the keys per round, so short contexts use few
// splits; the last split block of a (token, head chunk) to finish merges the partials and
// resets its counter to zero.
#include "attention_common.cuh"

// Cache row of key j (or -1 past the span end).
__device__ __forceinline__ long long dec_row(const int* bt_row, int base_row, int j, int end,
                                            int bs, int KH, int kh) {
  if (j >= end) return -1;
  if (bt_row) return ((long long)__ldg(bt_row + j / bs) * bs + j % bs) * KH + kh;
  return (long long)(base_row + j) * KH + kh;
}

// Merge the n_act partials of HB heads (last block only); part_* rows are [th, num_splits].
// Each thread owns four outputs and folds the splits in online, B partials in flight at once.
template <typename T, int D, int HB>
__device__ void dec_combine(T* out, const float* part_acc, const float* part_ml, long long th0,
                            int S, int n_act, float kv_scale) {
  constexpr int B = 16;
  for (int idx = threadIdx.x; idx < HB * D / 4; idx += blockDim.x) {
    int hh = idx / (D / 4), d = (idx % (D / 4)) * 4;
    const float* ml = part_ml + (th0 + hh) * S * 2;
    const float* pa = part_acc + (th0 + hh) * S * D + d;
    float mx = NEG_INF, L = 0.f;
    float4 A = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int s0 = 0; s0 < n_act; s0 += B) {
      float2 m2[B];
      float4 v[B];
#pragma unroll
      for (int j = 0; j < B; j++) {
        bool in = s0 + j < n_act;
        m2[j] = in ? __ldcg(reinterpret_cast<const float2*>(ml + 2 * (s0 + j)))
                   : make_float2(NEG_INF, 0.f);
        v[j] = in ? __ldcg(reinterpret_cast<const float4*>(pa + (long long)(s0 + j) * D))
                  : make_float4(0.f, 0.f, 0.f, 0.f);
      }
      float mb = mx;
#pragma unroll
      for (int j = 0; j < B; j++) mb = fmaxf(mb, m2[j].x);
      if (mb == NEG_INF) continue;
      float c = exp2f(mx - mb);
      L *= c; A.x *= c; A.y *= c; A.z *= c; A.w *= c;
#pragma unroll
      for (int j = 0; j < B; j++) {
        float w = m2[j].x == NEG_INF ? 0.f : exp2f(m2[j].x - mb);
        L += w * m2[j].y;
        A.x += w * v[j].x; A.y += w * v[j].y; A.z += w * v[j].z; A.w += w * v[j].w;
      }
      mx = mb;
    }
    float f = L > 0.f ? kv_scale / L : 0.f;
    T* o = out + (th0 + hh) * D + d;
    o[0] = from_f32<T>(A.x * f); o[1] = from_f32<T>(A.y * f);
    o[2] = from_f32<T>(A.z * f); o[3] = from_f32<T>(A.w * f);
  }
}

template <typename T, typename C, int D, int HB>
__device__ void attn_dec_impl(T* out, float* part_acc, float* part_ml, int* counters,
                              const T* q, const C* kb, const C* vb, const int* block_tables,
                              const int* seq_lens, const int* cu_q, AttnArgs a) {
  constexpr int LPK = D / 8, KPW = 32 / LPK, NW = 4, NG = NW * KPW;
  constexpr int U = 4, R = NG * U;
  __shared__ float sm_acc[NG][HB][D];
  __shared__ float sm_m[NG][HB], sm_l[NG][HB];
  __shared__ int sm_last;
  pdl_trigger();
  pdl_wait();  // launched with PDL after rope: q and the new K/V rows must be written
  int t = blockIdx.x, split = blockIdx.z;
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, dl = lane % LPK;
  int g = warp * KPW + lane / LPK;
  int H = a.num_heads, KH = a.num_kv_heads, G = H / KH, chunks = G / HB;
  int kh = blockIdx.y / chunks, h0 = kh * G + (blockIdx.y % chunks) * HB;
  int b = find_seq(cu_q, a.num_seqs, t);
  int n_q = cu_q[b + 1] - cu_q[b], i = t - cu_q[b];
  const int* bt_row = block_tables ? block_tables + (long long)b * a.max_blocks : 0;
  int len = (block_tables ? seq_lens[b] - n_q + i : i) + 1;
  int chunk = (max(len, 1) + a.num_splits - 1) / a.num_splits;
  chunk = (chunk + R - 1) / R * R;
  int n_act = max(1, (len + chunk - 1) / chunk);
  if (split >= n_act) return;
  int start = split * chunk, end = min(start + chunk, len);

  float qf[HB][8], m[HB], l[HB], acc[HB][8];
#pragma unroll
  for (int hh = 0; hh < HB; hh++) {
    Vec8<T> qv; qv.load(q + ((long long)t * H + h0 + hh) * D + dl * 8); qv.to_float(qf[hh]);
#pragma unroll
    for (int e = 0; e < 8; e++) { qf[hh][e] *= a.scale_log2 * a.kv_scale; acc[hh][e] = 0.f; }
    m[hh] = NEG_INF; l[hh] = 0.f;
  }
  int base_row = block_tables ? 0 : cu_q[b];
  long long row[U], nrow[U];
  Vec8<C> kv[U] = {}, vv[U] = {};
#pragma unroll
  for (int u = 0; u < U; u++) {
    row[u] = dec_row(bt_row, base_row, start + u * NG + g, end, a.block_size, KH, kh);
    if (row[u] >= 0) { kv[u].load(kb + row[u] * D + dl * 8); vv[u].load(vb + row[u] * D + dl * 8); }
  }
#pragma unroll
  for (int u = 0; u < U; u++)
    nrow[u] = dec_row(bt_row, base_row, start + R + u * NG + g, end, a.block_size, KH, kh);
  for (int base = start; base < end; base += R) {
    Vec8<C> kn[U] = {}, vn[U] = {};
    bool valid[U];
#pragma unroll
    for (int u = 0; u < U; u++) {
      valid[u] = row[u] >= 0;
      if (nrow[u] >= 0) { kn[u].load(kb + nrow[u] * D + dl * 8); vn[u].load(vb + nrow[u] * D + dl * 8); }
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
      row[u] = nrow[u];
      nrow[u] = dec_row(bt_row, base_row, base + 2 * R + u * NG + g, end, a.block_size, KH, kh);
    }
    float s[U][HB];
#pragma unroll
    for (int u = 0; u < U; u++) {
      float kf[8]; kv[u].to_float(kf);
#pragma unroll
      for (int hh = 0; hh < HB; hh++) {
        float x = 0.f;
#pragma unroll
        for (int e = 0; e < 8; e++) x += qf[hh][e] * kf[e];
#pragma unroll
        for (int o = LPK / 2; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
        s[u][hh] = valid[u] ? x : NEG_INF;
      }
    }
#pragma unroll
    for (int hh = 0; hh < HB; hh++) {
      float mn = m[hh];
#pragma unroll
      for (int u = 0; u < U; u++) mn = fmaxf(mn, s[u][hh]);
      if (mn == NEG_INF) continue;
      float corr = exp2f(m[hh] - mn);
      l[hh] *= corr;
#pragma unroll
      for (int e = 0; e < 8; e++) acc[hh][e] *= corr;
      m[hh] = mn;
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
      float vf[8]; vv[u].to_float(vf);
#pragma unroll
      for (int hh = 0; hh < HB; hh++) {
        float p = valid[u] ? exp2f(s[u][hh] - m[hh]) : 0.f;
        l[hh] += p;
#pragma unroll
        for (int e = 0; e < 8; e++) acc[hh][e] += p * vf[e];
      }
    }
#pragma unroll
    for (int u = 0; u < U; u++) { kv[u] = kn[u]; vv[u] = vn[u]; }
  }
#pragma unroll
  for (int hh = 0; hh < HB; hh++) {
#pragma unroll
    for (int e = 0; e < 8; e++) sm_acc[g][hh][dl * 8 + e] = acc[hh][e];
    if (dl == 0) { sm_m[g][hh] = m[hh]; sm_l[g][hh] = l[hh]; }
  }
  __syncthreads();
  long long th0 = (long long)t * H + h0;
  for (int idx = threadIdx.x; idx < HB * D; idx += blockDim.x) {
    int hh = idx / D, d = idx % D;
    float mx = NEG_INF;
    for (int gg = 0; gg < NG; gg++) mx = fmaxf(mx, sm_m[gg][hh]);
    float L = 0.f, A = 0.f;
    if (mx != NEG_INF) {
      for (int gg = 0; gg < NG; gg++) {
        float w = exp2f(sm_m[gg][hh] - mx);
        L += sm_l[gg][hh] * w;
        A += sm_acc[gg][hh][d] * w;
      }
    }
    long long th = th0 + hh;
    if (n_act == 1) {
      out[th * D + d] = from_f32<T>(L > 0.f ? A / L * a.kv_scale : 0.f);
    } else {
      part_acc[(th * a.num_splits + split) * D + d] = A;
      if (d == 0) {
        part_ml[(th * a.num_splits + split) * 2] = mx;
        part_ml[(th * a.num_splits + split) * 2 + 1] = L;
      }
    }
  }
  if (n_act == 1) return;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    int* c = counters + (long long)t * gridDim.y + blockIdx.y;
    sm_last = atomicAdd(c, 1) == n_act - 1;
    if (sm_last) atomicExch(c, 0);
  }
  __syncthreads();
  if (!sm_last) return;
  __threadfence();
  dec_combine<T, D, HB>(out, part_acc, part_ml, th0, a.num_splits, n_act, a.kv_scale);
}

// attn_dec[_fp8]_<dtype>_d<D>_h<HB>: _fp8 reads a float8_e4m3fn paged cache (head dims 64-256).
#define DEC_ONE(T, S, D, HB, C, CS)                                                           \
  extern "C" __global__ void __launch_bounds__(128) attn_dec##CS##_##S##_d##D##_h##HB(     \
      T* out, float* pa, float* pm, int* cnt, const T* q, const C* k, const C* v,             \
      const int* bt, const int* sl, const int* cu, int H, int KH, int bs, int mb, int ns,     \
      int nsp, float sc, float kvs) {                                                         \
    AttnArgs a{H, KH, bs, mb, ns, nsp, sc, kvs};                                               \
    attn_dec_impl<T, C, D, HB>(out, pa, pm, cnt, q, k, v, bt, sl, cu, a);                     \
  }
#define DEC_HB(T, S, D, C, CS)                                                                \
  DEC_ONE(T, S, D, 1, C, CS) DEC_ONE(T, S, D, 2, C, CS) DEC_ONE(T, S, D, 4, C, CS)
#define DEC(T, S)                                                                             \
  DEC_HB(T, S, 16, T, ) DEC_HB(T, S, 32, T, ) DEC_HB(T, S, 64, T, )                           \
  DEC_HB(T, S, 128, T, ) DEC_HB(T, S, 256, T, )                                               \
  DEC_HB(T, S, 64, fp8, _fp8) DEC_HB(T, S, 128, fp8, _fp8) DEC_HB(T, S, 256, fp8, _fp8)
INSTANTIATE(DEC)
