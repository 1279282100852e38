// Split decode attention (attention_decode.cu) and its variant with the q/k-norm + rope +
// KV-write prologue folded in (attention_rope_decode.cu).
// Grid (query token, kv head x head chunk, split); a block scores one span of a query's keys
// for HB <= 4 query heads sharing one KV head. A lane group of D/8 lanes scores U keys a round
// while the next round's K/V loads are in flight (block-table entries one round further
// ahead). The span length is a multiple of the keys per round, so short contexts use few
// splits; the last split block of a (token, head chunk) to finish merges the partials and
// resets its counter to zero.
#pragma once
#include "attention_common.cuh"
#include "kv_nvfp4.cuh"
#include "rope_common.cuh"

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

// After a split block wrote its partials: whether it is the last of the n_act split blocks of
// its (token, head chunk) to finish, and so merges them (dec_combine). Resets the counter to
// zero for the next launch or graph replay. Every thread of the block gets the same answer.
// (attn_dec_impl below spells the same steps out with its profiling stamps between them; moving
// it onto this helper changed the fused kernel's machine code, so it waits for a GPU check.)
__device__ __forceinline__ bool dec_last_split(int* counters, int t, int n_act) {
  __shared__ int last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    int* c = counters + (long long)t * gridDim.y + blockIdx.y;
    last = atomicAdd(c, 1) == n_act - 1;
    if (last) atomicExch(c, 0);
  }
  __syncthreads();
  if (!last) return false;
  __threadfence();
  return true;
}

// Score the newest key (shared memory, cache dtype) against the lane's query slices and
// fold it and its value into the running softmax state; only `apply` lanes keep the result.
template <typename C, int HB>
__device__ __forceinline__ void dec_fold_new(const C* k, const C* v, const float (*qf)[8],
                                             float* m, float* l, float (*acc)[8], bool apply,
                                             int lpk) {
  float kf[8], vf[8];
#pragma unroll
  for (int e = 0; e < 8; e++) { kf[e] = to_f32(k[e]); vf[e] = to_f32(v[e]); }
#pragma unroll
  for (int hh = 0; hh < HB; hh++) {
    float x = lane_group_dot(qf[hh], kf, lpk);
    if (!apply) continue;
    float mn = fmaxf(m[hh], x), corr = exp2f(m[hh] - mn), p = exp2f(x - mn);
    l[hh] = l[hh] * corr + p;
#pragma unroll
    for (int e = 0; e < 8; e++) acc[hh][e] = acc[hh][e] * corr + p * vf[e];
    m[hh] = mn;
  }
}

// Inputs of the fused rope prologue (zero for plain decode attention).
struct DecRope {
  const int* positions;
  const float* cos_sin;
  const int* slots;
  const void *q_norm, *k_norm;
  int norm_f32;
  RopeArgs r;
};

// What the rope prologue reads that does not depend on the qkv GEMV (cos/sin of this token's
// position, the q/k norm weights: host-written or static), loaded before the PDL wait. Lane
// `lane` owns elements lane + 32 c of a head.
template <int D>
struct DecRopePre {
  float c[D / 32], s[D / 32], qn[D / 32], kn[D / 32];
};

// A q/k norm weight (T, or float with f32), 1 without a norm.
template <typename T>
__device__ __forceinline__ float dec_norm_at(const void* norm, int i, int f32) {
  if (!norm) return 1.f;
  return f32 ? ((const float*)norm)[i] : to_f32(((const T*)norm)[i]);
}

template <typename T, int D>
__device__ __forceinline__ void dec_rope_preload(DecRopePre<D>& pre, int t, const DecRope& p) {
  int lane = threadIdx.x & 31, rot = p.r.rotary_dim, half = rot / 2;
  const float* cs = p.cos_sin + (long long)p.positions[t] * rot;
#pragma unroll
  for (int c = 0; c < D / 32; c++) {
    int i = lane + 32 * c, j = p.r.is_neox ? (i < half ? i : i - half) : i / 2;
    pre.c[c] = i < rot ? cs[j] : 1.f;
    pre.s[c] = i < rot ? cs[half + j] : 0.f;
    pre.qn[c] = dec_norm_at<T>(p.q_norm, i, p.norm_f32);
    pre.kn[c] = dec_norm_at<T>(p.k_norm, i, p.norm_f32);
  }
}

// Norm and rotate the block's HB query heads of token t into sm_q and, with `sub` (last split,
// the token has a cache slot), the newest key and value into sm_kv as the cache stores them;
// `writer` (one block of the kv head) also writes those to the cache. A warp takes heads warp
// and warp + 4 together (their loads in flight at once), in registers: one L2 round trip after
// the wait. Same arithmetic as rope_head (rope_common.cuh).
template <typename T, typename C, int D, int HB>
__device__ void dec_rope_prologue(T* sm_q, C* sm_kv, float* scratch, const T* qkv, C* kb, C* vb,
                                  int t, int h0, int kh, bool sub, bool writer,
                                  const DecRope& p, const DecRopePre<D>& pre) {
  constexpr int EC = D / 32;
  static_assert(HB + 2 <= 8, "at most two heads per warp");
  int H = p.r.num_heads, KH = p.r.num_kv_heads, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int n = HB + (sub ? 2 : 0), rot = p.r.rotary_dim, half = rot / 2;
  const T* row = qkv + (long long)t * (H + 2 * KH) * D;
  float v[2][EC];
#pragma unroll
  for (int s = 0; s < 2; s++) {
    int i = warp + 4 * s;
    const T* src = row + (i < HB ? h0 + i : i == HB ? H + kh : H + KH + kh) * D;
#pragma unroll
    for (int c = 0; c < EC; c++) v[s][c] = i < n ? to_f32(src[lane + 32 * c]) : 0.f;
  }
#pragma unroll
  for (int s = 0; s < 2; s++) {
    int i = warp + 4 * s;
    if (i >= n) break;
    bool q = i < HB;
    if (q ? p.q_norm != 0 : (i == HB && p.k_norm != 0)) {
      float ss = 0.f;
#pragma unroll
      for (int c = 0; c < EC; c++) ss += v[s][c] * v[s][c];
      float inv = rsqrtf(warp_sum(ss) / D + p.r.eps);
#pragma unroll
      for (int c = 0; c < EC; c++)
        v[s][c] = to_f32(from_f32<T>(v[s][c] * inv * (q ? pre.qn[c] : pre.kn[c])));
    }
    float* sc = scratch + (warp * 2 + s) * D;
#pragma unroll
    for (int c = 0; c < EC; c++) sc[lane + 32 * c] = v[s][c];
  }
  __syncwarp();
#pragma unroll
  for (int s = 0; s < 2; s++) {
    int i = warp + 4 * s;
    if (i >= n) break;
    const float* sc = scratch + (warp * 2 + s) * D;
    float scale = i < HB ? 1.f : p.r.inv_kv_scale;
#pragma unroll
    for (int c = 0; c < EC; c++) {
      int e = lane + 32 * c;
      float x = v[s][c];
      if (i <= HB && e < rot) {
        bool first = p.r.is_neox ? e < half : (e & 1) == 0;
        int partner = p.r.is_neox ? (first ? e + half : e - half) : (first ? e + 1 : e - 1);
        float y = sc[partner];
        x = first ? x * pre.c[c] - y * pre.s[c] : x * pre.c[c] + y * pre.s[c];
      }
      if (i < HB) sm_q[i * D + e] = from_f32<T>(x);
      else sm_kv[(i - HB) * D + e] = from_f32<C>(x * scale);
    }
  }
  __syncthreads();
  if (sub && writer) {
    long long base = ((long long)p.slots[t] * KH + kh) * D;
    for (int i = threadIdx.x; i < D; i += blockDim.x) {
      kb[base + i] = sm_kv[i];
      vb[base + i] = sm_kv[D + i];
    }
  }
}

// FUSED (attention_rope_decode.cu): q is the qkv projection; every block normalises and
// rotates its own query heads, the last split's blocks also the newest key/value (kept in
// shared memory and scored from there instead of the cache), and one of them writes them.
// BIDIR (attention_bidir.cu, dense K/V only): every query sees all keys of its sequence.
// C = nvfp4 (plain decode only): packed rows of kv_row_bytes(D) bytes, dequantized in registers.
template <typename T, typename C, int D, int HB, bool FUSED, bool BIDIR = false>
__device__ void attn_dec_impl(T* out, float* part_acc, float* part_ml, int* counters,
                              const T* q, C* kb, C* vb, const int* block_tables,
                              const int* seq_lens, const int* cu_q, AttnArgs a, const DecRope& rp) {
  constexpr int LPK = D / 8, KPW = 32 / LPK, NW = 4, NG = NW * KPW;
  constexpr int U = 4, R = NG * U;
  __shared__ float sm_acc[NG][HB][D];
  __shared__ float sm_m[NG][HB], sm_l[NG][HB];
  __shared__ int sm_last;
  if constexpr (!FUSED) {
    pdl_trigger();
    pdl_wait();  // launched with PDL after rope, which writes the newest key: wait first
  }
  int t = blockIdx.x, split = blockIdx.z;
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, dl = lane % LPK;
  int g = warp * KPW + lane / LPK;
  int H = a.num_heads, KH = a.num_kv_heads, G = H / KH, chunks = G / HB;
  int kh = blockIdx.y / chunks, h0 = kh * G + (blockIdx.y % chunks) * HB;
  int b = find_seq(cu_q, a.num_seqs, t);
  int n_q = cu_q[b + 1] - cu_q[b], i = t - cu_q[b];
  const int* bt_row = block_tables ? block_tables + (long long)b * a.max_blocks : 0;
  int len = BIDIR ? n_q : (block_tables ? seq_lens[b] - n_q + i : i) + 1;
  // keys lo .. len - 1: all of them, or the last `window` (the blocks before are never read)
  int lo = !BIDIR && a.window > 0 ? max(0, len - a.window) : 0, span = len - lo;
  int chunk = (max(span, 1) + a.num_splits - 1) / a.num_splits;
  chunk = (chunk + R - 1) / R * R;
  int n_act = max(1, (span + chunk - 1) / chunk);
  if (split >= n_act) return;
  profile_stamp(0);
  int start = lo + split * chunk, end = min(start + chunk, len);
  const T* qrow = q + ((long long)t * H + h0) * D;
  const C* kv_new = 0;  // FUSED: the newest key then value (cache dtype), or none
  bool sub = false;     // FUSED: the newest key/value come from shared memory, not the cache
  if constexpr (FUSED) {
    sub = split == n_act - 1 && rp.slots[t] >= 0;
    if (sub) end = len - 1;
  }
  int base_row = block_tables ? 0 : cu_q[b];
  long long row[U], nrow[U];
  typename KVVec<C>::type kv[U] = {}, vv[U] = {};
#pragma unroll
  for (int u = 0; u < U; u++) {
    row[u] = dec_row(bt_row, base_row, start + u * NG + g, end, a.block_size, KH, kh);
    if (row[u] >= 0) { kv_load<C, D>(kv[u], kb, row[u], dl); kv_load<C, D>(vv[u], vb, row[u], dl); }
  }
#pragma unroll
  for (int u = 0; u < U; u++)
    nrow[u] = dec_row(bt_row, base_row, start + R + u * NG + g, end, a.block_size, KH, kh);
  if constexpr (FUSED) {  // while the first keys load
    // Launched with PDL after the qkv GEMV. Everything above reads only what the host wrote
    // before the graph ran and cache rows of earlier steps (this step's key is scored from
    // shared memory), so the first keys stream while the GEMV drains; q waits for it.
    DecRopePre<D> pre;
    dec_rope_preload<T, D>(pre, t, rp);
    pdl_trigger();
    pdl_wait();
    profile_stamp(1);
    __shared__ __align__(16) T sm_q[HB * D];
    __shared__ C sm_kv[2 * D];
    dec_rope_prologue<T, C, D, HB>(sm_q, sm_kv, &sm_acc[0][0][0], q, kb, vb, t, h0, kh, sub,
                                   blockIdx.y % chunks == 0, rp, pre);
    qrow = sm_q;
    if (sub) kv_new = sm_kv;
    profile_stamp(2);
  }

  float qf[HB][8], m[HB], l[HB], acc[HB][8];
#pragma unroll
  for (int hh = 0; hh < HB; hh++) {
    Vec8<T> qv; qv.load(qrow + hh * D + dl * 8); qv.to_float(qf[hh]);
#pragma unroll
    for (int e = 0; e < 8; e++) { qf[hh][e] *= a.scale_log2 * a.kv_scale; acc[hh][e] = 0.f; }
    m[hh] = NEG_INF; l[hh] = 0.f;
  }
  for (int base = start; base < end; base += R) {
    typename KVVec<C>::type kn[U] = {}, vn[U] = {};
    bool valid[U];
#pragma unroll
    for (int u = 0; u < U; u++) {
      valid[u] = row[u] >= 0;
      if (nrow[u] >= 0) {
        kv_load<C, D>(kn[u], kb, nrow[u], dl);
        kv_load<C, D>(vn[u], vb, nrow[u], dl);
      }
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
        float x = lane_group_dot(qf[hh], kf, LPK);
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
  profile_stamp(3);
  if constexpr (FUSED) {
    if (kv_new)
      dec_fold_new<C, HB>(kv_new + dl * 8, kv_new + D + dl * 8, qf, m, l, acc, g == 0, LPK);
  }
  attn_group_store<NG, HB, D>(sm_acc, sm_m, sm_l, g, dl, acc, m, l);
  long long th0 = (long long)t * H + h0;
  attn_group_write<T, NG, HB, D>(out, part_acc, part_ml, sm_acc, sm_m, sm_l, th0, split,
                                 a.num_splits, n_act == 1, a.kv_scale);
  profile_stamp(4);
  if (n_act == 1) return;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    int* c = counters + (long long)t * gridDim.y + blockIdx.y;
    sm_last = atomicAdd(c, 1) == n_act - 1;
    if (sm_last) atomicExch(c, 0);
  }
  __syncthreads();
  profile_stamp(5);
  if (!sm_last) return;
  __threadfence();
  dec_combine<T, D, HB>(out, part_acc, part_ml, th0, a.num_splits, n_act, a.kv_scale);
#ifdef ATLAS_PROFILE
  __syncthreads();
  profile_stamp(6);
#endif
}
