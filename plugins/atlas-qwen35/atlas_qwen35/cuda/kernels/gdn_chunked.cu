// Gated delta rule for prefill in chunked (WY) form, float32 math and state
// (atlas_qwen35/gdn_reference.py).
// Per value head, a chunk of C = 64 tokens starting from state S0 ([Dk, Dv]), with the in-chunk
// log decay gamma_i = sum_{j<=i} g_j, G_i = exp(gamma_i) and the strictly lower
// A_ij = beta_i (G_i / G_j) k_i.k_j:
//   W = (I + A)^-1 (beta G K),  U = (I + A)^-1 (beta V)          (gdn_chunk_prep, in parallel)
//   V' = U - W S0;  O = (G Q) S0 + tril((Q K^T) G_i / G_j) V';  S = G_C S0 + (G_C / G) K^T V'
// (gdn_chunk_scan, chunk after chunk). Dk is 128; Dv a multiple of 16, at most 128.
// Scratch, all float32 and indexed by token t and value head h: W [t][h][128], U [t][h][Dv],
// G Q (scaled, L2-normalised) [t][h][128], (G_C / G) K [t][h][128], the decayed Q K^T row
// [t][h][64] and gamma [t][h].
#include "common.cuh"
#include "mma.cuh"

constexpr int GC_C = 64, GC_DK = 128, GC_THREADS = 256;
constexpr int GC_LDQ = GC_DK + 1, GC_LDA = GC_C + 1;  // odd strides: column reads hit all banks
constexpr int GC_LDB = GC_DK + 4, GC_LDT = GC_C + 4;  // 16-byte rows for cp.async
constexpr int GC_COLS = 16;                          // state columns per scan block

struct GdnScratch {
  float *w, *u, *qg, *kt, *attn, *gam;
};
extern __shared__ __align__(16) float gc_smem[];

// Block x -> (sequence b, first token t0, tokens n) of the x-th chunk; false past the last one.
__device__ __forceinline__ bool gc_chunk(const int* cu, int num_seqs, int x, int& t0, int& n) {
  for (int b = 0; b < num_seqs; b++) {
    int start = cu[b], len = cu[b + 1] - start, chunks = (len + GC_C - 1) / GC_C;
    if (x < chunks) {
      t0 = start + x * GC_C;
      n = min(GC_C, len - x * GC_C);
      return true;
    }
    x -= chunks;
  }
  return false;
}

// q, k rows of the chunk (zeros past n) L2-normalised, q scaled; gamma and beta (0 past n).
template <typename T>
__device__ void gc_load_qk(float* qs, float* ks, float* gam, float* bet, const T* qkv,
                           const float* g, const float* beta, int t0, int n, int h, int kh,
                           int hk, int hv, long long stride, float scale, int l2norm) {
  int tid = threadIdx.x;
  for (int c = tid; c < GC_C * GC_DK; c += GC_THREADS) {
    int r = c / GC_DK, col = c % GC_DK;
    const T* row = qkv + (long long)(t0 + (r < n ? r : 0)) * stride;
    qs[r * GC_LDQ + col] = r < n ? to_f32(row[kh * GC_DK + col]) : 0.f;
    ks[r * GC_LDQ + col] = r < n ? to_f32(row[(hk + kh) * GC_DK + col]) : 0.f;
  }
  if (tid < GC_C) {
    gam[tid] = tid < n ? g[(long long)(t0 + tid) * hv + h] : 0.f;
    bet[tid] = tid < n ? beta[(long long)(t0 + tid) * hv + h] : 0.f;
  }
  __syncthreads();
  int lane = tid & 31, warp = tid >> 5;
  for (int r = warp; r < 2 * GC_C; r += GC_THREADS / 32) {
    float* x = r < GC_C ? qs + r * GC_LDQ : ks + (r - GC_C) * GC_LDQ;
    float ss = 0.f;
    for (int i = lane; i < GC_DK; i += 32) ss += x[i] * x[i];
    float f = l2norm ? rsqrtf(warp_sum(ss) + 1e-6f) : 1.f;
    if (r < GC_C) f *= scale;
    for (int i = lane; i < GC_DK; i += 32) x[i] *= f;
  }
  if (tid == 0)
    for (int i = 1; i < GC_C; i++) gam[i] += gam[i - 1];
  __syncthreads();
}

// Q K^T and K K^T of the chunk (4x4 register tiles): the decayed lower Q K^T rows go to
// scratch, A (strictly lower, scaled by beta) to shared memory.
__device__ void gc_gram(float* as, const float* qs, const float* ks, const float* gam,
                        const float* bet, float* attn, int t0, int n, int h, int hv) {
  int ti = threadIdx.x / 16, tj = threadIdx.x % 16;
  float qk[4][4] = {}, kk[4][4] = {};
  for (int d = 0; d < GC_DK; d++) {
    float a[4], b[4], c[4];
#pragma unroll
    for (int m = 0; m < 4; m++) {
      a[m] = qs[(ti + 16 * m) * GC_LDQ + d];
      b[m] = ks[(ti + 16 * m) * GC_LDQ + d];
      c[m] = ks[(tj + 16 * m) * GC_LDQ + d];
    }
#pragma unroll
    for (int m = 0; m < 4; m++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        qk[m][e] += a[m] * c[e];
        kk[m][e] += b[m] * c[e];
      }
  }
#pragma unroll
  for (int m = 0; m < 4; m++) {
    int i = ti + 16 * m;
#pragma unroll
    for (int e = 0; e < 4; e++) {
      int j = tj + 16 * e;
      float decay = j <= i ? expf(gam[i] - gam[j]) : 0.f;
      as[i * GC_LDA + j] = j < i ? bet[i] * decay * kk[m][e] : 0.f;
      if (i < n) attn[((long long)(t0 + i) * hv + h) * GC_C + j] = decay * qk[m][e];
    }
  }
}

// Forward substitution through the unit lower triangular I + A, one right-hand-side column per
// thread: columns 0..127 are beta V (the first Dv of them), 128..255 beta G K. Each column
// depends only on itself, so no barrier is needed and it stays in registers.
template <typename T>
__device__ void gc_solve(GdnScratch s, const float* as, const float* ks, const float* gam,
                         const float* bet, const T* qkv, int t0, int n, int h, int hk, int hv,
                         int dv, long long stride) {
  int c = threadIdx.x;
  bool is_v = c < GC_DK;
  int col = is_v ? c : c - GC_DK;
  if (is_v && col >= dv) return;
  float x[GC_C];
#pragma unroll
  for (int i = 0; i < GC_C; i++) {
    float r = 0.f;
    if (i < n)
      r = is_v ? to_f32(qkv[(long long)(t0 + i) * stride + 2 * hk * GC_DK + h * dv + col])
               : expf(gam[i]) * ks[i * GC_LDQ + col];
    x[i] = bet[i] * r;
  }
#pragma unroll
  for (int i = 1; i < GC_C; i++) {
    float acc = x[i];
#pragma unroll
    for (int j = 0; j < i; j++) acc -= as[i * GC_LDA + j] * x[j];
    x[i] = acc;
  }
  float* dst = is_v ? s.u : s.w;
  int width = is_v ? dv : GC_DK;
#pragma unroll
  for (int i = 0; i < GC_C; i++)
    if (i < n) dst[((long long)(t0 + i) * hv + h) * width + col] = x[i];
}

// Grid (max chunks, Hv), GC_THREADS threads, dynamic shared memory 2 * 64 * 129 + 64 * 65 + 128
// floats.
template <typename T>
__device__ void gdn_chunk_prep_impl(GdnScratch s, const T* qkv, const float* g,
                                    const float* beta, const int* cu, int num_seqs, int hk,
                                    int hv, int dv, float scale, int l2norm) {
  int t0, n;
  if (!gc_chunk(cu, num_seqs, blockIdx.x, t0, n)) return;
  float* qs = gc_smem;
  float* ks = qs + GC_C * GC_LDQ;
  float* as = ks + GC_C * GC_LDQ;
  float* gam = as + GC_C * GC_LDA;
  float* bet = gam + GC_C;
  int h = blockIdx.y, kh = h / (hv / hk);
  long long stride = 2LL * hk * GC_DK + (long long)hv * dv;
  gc_load_qk(qs, ks, gam, bet, qkv, g, beta, t0, n, h, kh, hk, hv, stride, scale, l2norm);
  float last = gam[n - 1];
  for (int c = threadIdx.x; c < n * GC_DK; c += GC_THREADS) {
    int i = c / GC_DK, d = c % GC_DK;
    long long o = ((long long)(t0 + i) * hv + h) * GC_DK + d;
    s.qg[o] = expf(gam[i]) * qs[i * GC_LDQ + d];
    s.kt[o] = expf(last - gam[i]) * ks[i * GC_LDQ + d];
    if (d == 0) s.gam[(long long)(t0 + i) * hv + h] = gam[i];
  }
  gc_gram(as, qs, ks, gam, bet, s.attn, t0, n, h, hv);
  __syncthreads();
  gc_solve(s, as, ks, gam, bet, qkv, t0, n, h, hk, hv, dv, stride);
}

// cp.async `rows` rows of `width` floats (a multiple of 4) at src[(t0 + r) * hv * width] into
// dst rows of `ld` floats; rows at or past n are zero-filled.
__device__ __forceinline__ void gc_stage(float* dst, int ld, const float* src, int width, int t0,
                                         int n, int hv) {
  int per_row = width / 4;
  for (int c = threadIdx.x; c < GC_C * per_row; c += GC_THREADS) {
    int r = c / per_row, col = (c % per_row) * 4;
    const float* p = src + (long long)(t0 + (r < n ? r : 0)) * hv * width + col;
    cp_async16(dst + r * ld + col, p, r < n);
  }
}

// wq[e] += sum_k W[i][k] hs[k][jq + e] and qs[e] += sum_k (G Q)[i][k] hs[k][jq + e] over the
// 128 state rows, sharing the state reads.
__device__ __forceinline__ void gc_rows_times_state(float* wq, float* qs, const float* wt,
                                                   const float* qt, const float* hs, int i,
                                                   int jq) {
#pragma unroll 2
  for (int k = 0; k < GC_DK; k += 4) {
    float4 a = *reinterpret_cast<const float4*>(wt + i * GC_LDB + k);
    float4 b = *reinterpret_cast<const float4*>(qt + i * GC_LDB + k);
    float av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
      float4 h4 = *reinterpret_cast<const float4*>(hs + (k + kk) * GC_COLS + jq);
      wq[0] += av[kk] * h4.x; wq[1] += av[kk] * h4.y; wq[2] += av[kk] * h4.z;
      wq[3] += av[kk] * h4.w;
      qs[0] += bv[kk] * h4.x; qs[1] += bv[kk] * h4.y; qs[2] += bv[kk] * h4.z;
      qs[3] += bv[kk] * h4.w;
    }
  }
}

// V' = U - W S0 into shared memory and acc = (G Q) S0 for this block's columns (thread: row
// tid / 4, columns 4 (tid % 4) + 0..3).
__device__ __forceinline__ void gc_new_values(float* vn, float* acc, const float* wt,
                                              const float* qt, const float* hs, const float* u,
                                              int t0, int n, int h, int hv, int dv, int col0) {
  int i = threadIdx.x / 4, jq = (threadIdx.x % 4) * 4;
  float w[4] = {0.f, 0.f, 0.f, 0.f};
  gc_rows_times_state(w, acc, wt, qt, hs, i, jq);
  float4 uv = make_float4(0.f, 0.f, 0.f, 0.f);
  if (i < n) uv = *reinterpret_cast<const float4*>(u + ((long long)(t0 + i) * hv + h) * dv +
                                                   col0 + jq);
  *reinterpret_cast<float4*>(vn + i * GC_COLS + jq) =
      make_float4(uv.x - w[0], uv.y - w[1], uv.z - w[2], uv.w - w[3]);
}

// O = acc + tril(decayed Q K^T) V' for this block's columns.
template <typename T>
__device__ __forceinline__ void gc_output(T* out, float* acc, const float* at, const float* vn,
                                          int t0, int n, int h, int hv, int dv, int col0) {
  int i = threadIdx.x / 4, jq = (threadIdx.x % 4) * 4;
#pragma unroll 8
  for (int m = 0; m < GC_C; m++) {
    float a = at[i * GC_LDT + m];
    float4 v = *reinterpret_cast<const float4*>(vn + m * GC_COLS + jq);
    acc[0] += a * v.x;
    acc[1] += a * v.y;
    acc[2] += a * v.z;
    acc[3] += a * v.w;
  }
  if (i >= n) return;
  T* o = out + ((long long)(t0 + i) * hv + h) * dv + col0 + jq;
#pragma unroll
  for (int e = 0; e < 4; e++) o[e] = from_f32<T>(acc[e]);
}

// S = G_C S0 + ((G_C / G) K)^T V' (thread: state row tid / 2, columns 8 (tid % 2) + 0..7).
__device__ __forceinline__ void gc_update_state(float* hs, const float* kt, const float* vn,
                                                float decay) {
  int k = threadIdx.x / 2, j8 = (threadIdx.x % 2) * 8;
  float acc[8];
#pragma unroll
  for (int e = 0; e < 8; e++) acc[e] = decay * hs[k * GC_COLS + j8 + e];
#pragma unroll 8
  for (int i = 0; i < GC_C; i++) {
    float a = kt[i * GC_LDB + k];
    float4 v0 = *reinterpret_cast<const float4*>(vn + i * GC_COLS + j8);
    float4 v1 = *reinterpret_cast<const float4*>(vn + i * GC_COLS + j8 + 4);
    acc[0] += a * v0.x; acc[1] += a * v0.y; acc[2] += a * v0.z; acc[3] += a * v0.w;
    acc[4] += a * v1.x; acc[5] += a * v1.y; acc[6] += a * v1.z; acc[7] += a * v1.w;
  }
#pragma unroll
  for (int e = 0; e < 8; e++) hs[k * GC_COLS + j8 + e] = acc[e];
}

// Grid (Dv / 16, Hv, num_seqs): a block carries 16 state columns of one (sequence, head) through
// its chunks. Shared memory: two staged [64][132] tiles (W then (G_C / G) K; G Q), the decayed
// Q K^T rows [64][68], the state slab [128][16] and V' [64][16]; next-chunk tiles are fetched
// with cp.async while the current one computes.
template <typename T>
__device__ void gdn_chunk_scan_impl(T* out, GdnScratch s, float* states, const int* cu,
                                    const int* seq_lens, const int* state_indices, int hv,
                                    int dv) {
  int b = blockIdx.z, h = blockIdx.y, col0 = blockIdx.x * GC_COLS, tid = threadIdx.x;
  int start = cu[b], end = cu[b + 1];
  if (end <= start) return;
  int slot = state_indices[b];
  bool has_state = slot >= 0 && seq_lens[b] > end - start;
  float* ta = gc_smem;
  float* tb = ta + GC_C * GC_LDB;
  float* at = tb + GC_C * GC_LDB;
  float* hs = at + GC_C * GC_LDT;
  float* vn = hs + GC_DK * GC_COLS;
  float* sp = states + ((long long)(slot < 0 ? 0 : slot) * hv + h) * GC_DK * dv + col0;
  for (int c = tid; c < GC_DK * GC_COLS; c += GC_THREADS)
    hs[c] = has_state ? sp[(long long)(c / GC_COLS) * dv + c % GC_COLS] : 0.f;
  const float *wsrc = s.w + h * GC_DK, *qsrc = s.qg + h * GC_DK, *ksrc = s.kt + h * GC_DK;
  const float* asrc = s.attn + h * GC_C;
  int n = min(GC_C, end - start);
  gc_stage(tb, GC_LDB, qsrc, GC_DK, start, n, hv);
  gc_stage(at, GC_LDT, asrc, GC_C, start, n, hv);
  gc_stage(ta, GC_LDB, wsrc, GC_DK, start, n, hv);
  asm volatile("cp.async.commit_group;\n");
  for (int t0 = start; t0 < end; t0 += GC_C) {
    n = min(GC_C, end - t0);
    asm volatile("cp.async.wait_group 0;\n");
    __syncthreads();
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    gc_new_values(vn, acc, ta, tb, hs, s.u, t0, n, h, hv, dv, col0);
    __syncthreads();
    gc_stage(ta, GC_LDB, ksrc, GC_DK, t0, n, hv);
    asm volatile("cp.async.commit_group;\n");
    gc_output(out, acc, at, vn, t0, n, h, hv, dv, col0);
    asm volatile("cp.async.wait_group 0;\n");
    __syncthreads();
    int next = t0 + GC_C, nn = min(GC_C, end - next);
    if (next < end) {
      gc_stage(tb, GC_LDB, qsrc, GC_DK, next, nn, hv);
      gc_stage(at, GC_LDT, asrc, GC_C, next, nn, hv);
      asm volatile("cp.async.commit_group;\n");
    }
    gc_update_state(hs, ta, vn, expf(s.gam[(long long)(t0 + n - 1) * hv + h]));
    __syncthreads();
    if (next < end) {
      gc_stage(ta, GC_LDB, wsrc, GC_DK, next, nn, hv);
      asm volatile("cp.async.commit_group;\n");
    }
  }
  if (slot < 0) return;
  for (int c = tid; c < GC_DK * GC_COLS; c += GC_THREADS)
    sp[(long long)(c / GC_COLS) * dv + c % GC_COLS] = hs[c];
}

#define GDN_CHUNKED(T, S)                                                                      \
  extern "C" __global__ void __launch_bounds__(GC_THREADS) gdn_chunk_prep_##S(                 \
      float* w, float* u, float* qg, float* kt, float* attn, float* gam, const T* qkv,         \
      const float* g, const float* beta, const int* cu, int num_seqs, int hk, int hv, int dv,  \
      float scale, int l2norm) {                                                               \
    gdn_chunk_prep_impl<T>(GdnScratch{w, u, qg, kt, attn, gam}, qkv, g, beta, cu, num_seqs,    \
                           hk, hv, dv, scale, l2norm);                                         \
  }                                                                                            \
  extern "C" __global__ void __launch_bounds__(GC_THREADS) gdn_chunk_scan_##S(                 \
      T* out, float* w, float* u, float* qg, float* kt, float* attn, float* gam,               \
      float* states, const int* cu, const int* seq_lens, const int* idx, int hv, int dv) {     \
    gdn_chunk_scan_impl<T>(out, GdnScratch{w, u, qg, kt, attn, gam}, states, cu, seq_lens,    \
                           idx, hv, dv);                                                       \
  }
INSTANTIATE(GDN_CHUNKED)
