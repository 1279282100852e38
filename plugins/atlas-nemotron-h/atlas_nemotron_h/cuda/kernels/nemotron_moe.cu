// atlas-nemotron-h: MoE routing and non-gated experts (references in
// atlas_nemotron_h/ffn_reference.py). Math in float32.
//
// Decode is memory bound, so every GEMV here keeps several 16-byte loads per lane in flight
// (NM_UNROLL / NM_DOWN_UNROLL chunks of 8 elements, issued before any is consumed) and spreads
// its rows over many warps; the router's logits are one such GEMV (a block per expert), and
// the top-k selection a one-warp kernel after it. The shared expert, when passed, runs as extra
// rows of the up kernel and extra K pieces of the split-K down kernel (no GEMVs, relu2 or add
// of its own). Every kernel is PDL-safe: it reads what an earlier kernel wrote only after
// pdl_wait() (the down kernel reads the routing before it: the up kernel between them triggers
// only after its own wait, so routing is complete by then).
#include "common.cuh"

#define NM_MAX_EXPERTS 1024
#define NM_MAX_GROUPS 64
#define NM_WARPS 4
#define NM_TOK 8          // tokens per router-logit block (the router row is read once for them)
#define NM_UNROLL 4       // 8-element chunks in flight per lane: router and up GEMVs
#define NM_DOWN_UNROLL 8  // the same per row for the down GEMV (bf16 / fp16; half in float32)
#define NM_DOWN_ROWS 2    // output rows per warp of the down GEMV (its h chunk read once)
#define NM_DOWN_TILE (NM_WARPS * NM_DOWN_ROWS)  // output rows per down block
#define NM_DOWN_PIECE 2048  // most K (h floats) per down block: its shared-memory copy of h

__device__ __forceinline__ float nm_warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Max (MAX) or min of v over the warp (every lane gets it).
template <bool MAX>
__device__ __forceinline__ u32 nm_reduce_u32(u32 v) {
#if __CUDA_ARCH__ >= 800
  if (MAX) asm volatile("redux.sync.max.u32 %0, %0, 0xffffffff;\n" : "+r"(v));
  else asm volatile("redux.sync.min.u32 %0, %0, 0xffffffff;\n" : "+r"(v));
#else
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    u32 w = __shfl_xor_sync(0xffffffffu, v, o);
    v = MAX ? max(v, w) : min(v, w);
  }
#endif
  return v;
}

// A float as an unsigned key of the same order (-inf > 0; 0 is left for "taken").
__device__ __forceinline__ u32 nm_key(float f) {
  u32 u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// A warp's dot product of x[0:n] and w[0:n] (float32 sum, every lane holds it): U 16-byte
// vector loads of each per lane in flight when n is a multiple of 8 (rows then start 16-byte
// aligned), else scalar.
template <int U, typename X, typename W>
__device__ __forceinline__ float nm_dot(const X* x, const W* w, int n, int lane) {
  float acc = 0.f;
  if ((n & 7) == 0) {
    for (int c0 = lane * 8; c0 < n; c0 += U * 256) {
      Vec8<X> xv[U];
      Vec8<W> wv[U];
#pragma unroll
      for (int u = 0; u < U; u++)
        if (c0 + u * 256 < n) { wv[u].load(w + c0 + u * 256); xv[u].load(x + c0 + u * 256); }
#pragma unroll
      for (int u = 0; u < U; u++) {
        if (c0 + u * 256 < n) {
          float xf[8], wf[8];
          xv[u].to_float(xf);
          wv[u].to_float(wf);
#pragma unroll
          for (int i = 0; i < 8; i++) acc += xf[i] * wf[i];
        }
      }
    }
  } else {
    for (int c = lane; c < n; c += 32) acc += to_f32(x[c]) * to_f32(w[c]);
  }
  return nm_warp_sum(acc);
}

// Grid (E, ceil(num_tokens / NM_TOK)), block 32 * NM_WARPS: block e writes logits[t, e] =
// x[t] . w[e] (float32) for its NM_TOK tokens, its threads splitting the row (read once for
// the tokens). The first NM_UNROLL chunks per thread of the (static) router row, 4096 floats
// at 4 warps, are loaded before the PDL wait, so at decode only x is read after it.
template <typename T>
__device__ void nm_logits_impl(float* logits, const T* x, const float* w, int ntok, int hidden,
                               int E) {
  __shared__ float part[NM_WARPS][NM_TOK];
  const int step = NM_WARPS * 256;  // elements of one 8-element chunk per thread
  int e = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  int t0 = blockIdx.y * NM_TOK, nt = min(NM_TOK, ntok - t0);
  bool vec = (hidden & 7) == 0;
  const float* wr = w + (long long)e * hidden;
  const T* xb = x + (long long)t0 * hidden;
  Vec8<float> wv[NM_UNROLL];
  if (vec) {
#pragma unroll
    for (int u = 0; u < NM_UNROLL; u++)
      if (tid * 8 + u * step < hidden) wv[u].load(wr + tid * 8 + u * step);
  }
  pdl_wait();
  pdl_trigger();
  float acc[NM_TOK];
#pragma unroll
  for (int m = 0; m < NM_TOK; m++) acc[m] = 0.f;
  if (vec) {
    for (int c0 = tid * 8; c0 < hidden; c0 += NM_UNROLL * step) {
      if (c0 != tid * 8) {
#pragma unroll
        for (int u = 0; u < NM_UNROLL; u++)
          if (c0 + u * step < hidden) wv[u].load(wr + c0 + u * step);
      }
#pragma unroll
      for (int u = 0; u < NM_UNROLL; u++) {
        int c = c0 + u * step;
        if (c < hidden) {
          float wf[8];
          wv[u].to_float(wf);
#pragma unroll
          for (int m = 0; m < NM_TOK; m++) {
            if (m < nt) {
              float xf[8];
              Vec8<T> xv;
              xv.load(xb + (long long)m * hidden + c);
              xv.to_float(xf);
#pragma unroll
              for (int i = 0; i < 8; i++) acc[m] += xf[i] * wf[i];
            }
          }
        }
      }
    }
  } else {
    for (int c = tid; c < hidden; c += 32 * NM_WARPS) {
      float wc = wr[c];
#pragma unroll
      for (int m = 0; m < NM_TOK; m++)
        if (m < nt) acc[m] += to_f32(xb[(long long)m * hidden + c]) * wc;
    }
  }
#pragma unroll
  for (int m = 0; m < NM_TOK; m++) {
    float v = nm_warp_sum(acc[m]);
    if (lane == 0) part[warp][m] = v;
  }
  __syncthreads();
  if (tid < nt) {
    float v = 0.f;
#pragma unroll
    for (int i = 0; i < NM_WARPS; i++) v += part[i][tid];
    logits[(long long)(t0 + tid) * E + e] = v;
  }
}

// One warp's top_k of one token: the largest keys (ties: lower index; a taken key becomes 0),
// weighted by their score, renormalised (sum + 1e-20) and scaled; slot j is written by lane
// j % 32. score / key: the token's E entries in this warp's shared memory.
__device__ __forceinline__ void nm_pick_topk(float* wt, int* id, const float* score, u32* key,
                                             int E, int top_k, int renorm, float scale,
                                             int lane) {
  float sum = 0.f;
  for (int j = 0; j < top_k; j++) {
    u32 best = 0u;
    int bi = E;
    for (int e = lane; e < E; e += 32)
      if (key[e] > best) { best = key[e]; bi = e; }
    u32 top = nm_reduce_u32<true>(best);
    int idx = (int)nm_reduce_u32<false>(best == top ? (u32)bi : 0xffffffffu);
    float s = score[idx];
    sum += s;
    if ((idx & 31) == lane) key[idx] = 0u;
    if ((j & 31) == lane) { id[j] = idx; wt[j] = s; }
    __syncwarp();
  }
  for (int j = lane; j < top_k; j += 32) wt[j] = (renorm ? wt[j] / (sum + 1e-20f) : wt[j]) * scale;
}

// Grid (num_tokens), block 32 (one warp per token): s = sigmoid(logit), choice = s + bias;
// group scores (sum of the two best choices; the one when a group has one expert), the
// topk_group best groups (ties: lower group), then the top_k best choices among their experts
// (the others rank as -inf, ties: lower index), weighted by s, renormalised (sum + 1e-20) and
// scaled; slot j is written by lane j % 32.
__device__ void nm_select_impl(float* weights, int* ids, const float* logits, const float* bias,
                               int E, int top_k, int n_group, int topk_group, int renorm,
                               float scale) {
  __shared__ float score[NM_MAX_EXPERTS], choice[NM_MAX_EXPERTS], gscore[NM_MAX_GROUPS];
  __shared__ u32 key[NM_MAX_EXPERTS];
  __shared__ unsigned char keep[NM_MAX_GROUPS];
  int t = blockIdx.x, lane = threadIdx.x;
  const float* lg = logits + (long long)t * E;
  pdl_wait();
  pdl_trigger();
  for (int e = lane; e < E; e += 32) {
    float s = 1.f / (1.f + expf(-lg[e]));
    score[e] = s;
    choice[e] = s + bias[e];
  }
  __syncwarp();
  int per = E / n_group;
  if (n_group > 1) {
    for (int g = lane; g < n_group; g += 32) {
      float a = NEG_INF, b = NEG_INF;
      for (int e = g * per; e < (g + 1) * per; e++) {
        float c = choice[e];
        if (c > a) { b = a; a = c; } else if (c > b) { b = c; }
      }
      gscore[g] = per > 1 ? a + b : a;
      keep[g] = 0;
    }
    __syncwarp();
    if (lane == 0) {
      for (int j = 0; j < topk_group; j++) {
        int best = -1;
        for (int g = 0; g < n_group; g++)
          if (!keep[g] && (best < 0 || gscore[g] > gscore[best])) best = g;
        keep[best] = 1;
      }
    }
    __syncwarp();
  }
  for (int e = lane; e < E; e += 32)
    key[e] = nm_key(n_group <= 1 || keep[e / per] ? choice[e] : NEG_INF);
  __syncwarp();
  nm_pick_topk(weights + (long long)t * top_k, ids + (long long)t * top_k, score, key, E, top_k,
               renorm, scale, lane);
}

// The router in one kernel (n_group 1, at most NM_ROUTE1_MAX_E experts): the logits blocks of
// nm_logits_impl, then the last block of each token group to finish (a counter per group,
// counted up with atomicAdd after a fence, and reset by that block for the next call) picks
// every token's top_k as nm_select_impl does, a warp per token, reading the logits from L2.
// Same logits, same selection: the same routing as the two kernels, bit for bit.
#define NM_ROUTE1_MAX_E 512
template <typename T>
__device__ void nm_route1_impl(float* weights, int* ids, float* logits, int* counters,
                               const T* x, const float* w, const float* bias, int ntok,
                               int hidden, int E, int top_k, int renorm, float scale) {
  __shared__ float score[NM_WARPS][NM_ROUTE1_MAX_E];
  __shared__ u32 key[NM_WARPS][NM_ROUTE1_MAX_E];
  __shared__ int s_last;
  nm_logits_impl<T>(logits, x, w, ntok, hidden, E);
  __threadfence();  // this block's logits, before its arrival is counted
  __syncthreads();
  if (threadIdx.x == 0) {
    s_last = atomicAdd(counters + blockIdx.y, 1) == E - 1;
    if (s_last) counters[blockIdx.y] = 0;  // every block of the group has arrived
  }
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int t0 = blockIdx.y * NM_TOK, nt = min(NM_TOK, ntok - t0);
  for (int m = warp; m < nt; m += NM_WARPS) {
    int t = t0 + m;
    const float* lg = logits + (long long)t * E;
    for (int e = lane; e < E; e += 32) {
      float sc = 1.f / (1.f + expf(-__ldcg(lg + e)));
      score[warp][e] = sc;
      key[warp][e] = nm_key(sc + bias[e]);
    }
    __syncwarp();
    nm_pick_topk(weights + (long long)t * top_k, ids + (long long)t * top_k, score[warp],
                 key[warp], E, top_k, renorm, scale, lane);
  }
}

// Grid (ceil((num_tokens * top_k * I + num_tokens * Is) / NM_WARPS)), a warp per row n of
// either: n < num_tokens * top_k * I: h[n] = h[r, i] = relu2(up_e[i] . x[t]) in float32,
// r = t * top_k + j, e = ids[r]; after them the shared expert (Is > 0):
// hs[m] = hs[t, i] = relu2(ws_up[i] . x[t]), m = n - num_tokens * top_k * I. It also zeroes
// the down kernel's n_cnt completion counters (that kernel reads them after its wait).
template <typename T>
__device__ void nm_up_impl(float* h, float* hs, int* cnt, const T* x, const T* w_up,
                           const T* ws_up, const int* ids, int ntok, int width, int inter,
                           int s_inter, int top_k, int n_cnt) {
  long long n = (long long)blockIdx.x * NM_WARPS + (threadIdx.x >> 5);
  long long routed = (long long)ntok * top_k * inter;
  int lane = threadIdx.x & 31;
  pdl_wait();
  pdl_trigger();
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n_cnt; i += gridDim.x * blockDim.x)
    cnt[i] = 0;
  const T *wr, *xr;
  float* dst;
  if (n < routed) {
    long long r = n / inter;
    wr = w_up + ((long long)ids[r] * inter + (n - r * inter)) * width;
    xr = x + (r / top_k) * width;
    dst = h + n;
  } else {
    long long m = n - routed, t = m / max(s_inter, 1);
    if (m >= (long long)ntok * s_inter) return;
    wr = ws_up + (m - t * s_inter) * width;
    xr = x + t * width;
    dst = hs + m;
  }
  float acc = fmaxf(nm_dot<NM_UNROLL>(xr, wr, width, lane), 0.f);
  if (lane == 0) *dst = acc * acc;
}

// One round of the down GEMV's weight loads: chunks c0 + 32 u (u < U, c0 + 32 u < nc) of
// the warp's NM_DOWN_ROWS rows (row r at w + r * ld; rows past the last, dead, are skipped).
template <int U, typename T>
__device__ __forceinline__ void nm_down_load(Vec8<T> (&wv)[NM_DOWN_ROWS][U], const T* w,
                                             long long ld, int live, int c0, int nc) {
#pragma unroll
  for (int r = 0; r < NM_DOWN_ROWS; r++)
#pragma unroll
    for (int u = 0; u < U; u++)
      if (r < live && c0 + 32 * u < nc) wv[r][u].load(w + r * ld + (c0 + 32 * u) * 8);
}

// Grid (ceil(width / NM_DOWN_TILE), pieces, num_tokens), block 32 * NM_WARPS: split-K down
// GEMV. A token's K is cut into pieces of at most `piece` (a multiple of 8 when inter is): the
// top_k routed slots' h rows (ceil(inter / piece) pieces each), then the shared expert's hs row
// (ceil(s_inter / piece)). Block (tile, p, t) stages its piece of h in shared memory once and
// its warps each dot NM_DOWN_ROWS output rows with it (U 16-byte loads per row and lane in
// flight), writing weights[t, j] * partial to part[t, p, o]. The last block of a (t, tile) to
// finish (cnt[t, tile], zeroed by the up kernel) sums the pieces in order p = 0, 1, ... and
// writes out[t, o] (deterministic, per token). The warp-per-row kernel this replaces re-read
// the token's whole h (2x the weight bytes, float32) from L2 for every row: L2 bound at about
// 2 TB/s of weights on the H200.
template <typename T>
__device__ void nm_down_impl(T* out, float* part, int* cnt, const float* h, const T* w_down,
                             const float* weights, const int* ids, const float* hs,
                             const T* ws_down, int width, int inter, int s_inter, int top_k,
                             int piece) {
  constexpr int U = sizeof(T) >= 4 ? NM_DOWN_UNROLL / 2 : NM_DOWN_UNROLL;
  __shared__ __align__(16) float s_h[NM_DOWN_PIECE];
  __shared__ bool s_last;
  int tile = blockIdx.x, p = blockIdx.y, lane = threadIdx.x & 31;
  long long t = blockIdx.z;
  int o0 = tile * NM_DOWN_TILE + (threadIdx.x >> 5) * NM_DOWN_ROWS;
  int live = min(NM_DOWN_ROWS, width - o0);  // rows of this warp (<= 0: none)
  int rp = (inter + piece - 1) / piece;
  const T* w;
  const float* hp;
  float wt;
  int len, k0;
  long long ld;
  // The routing is complete before the wait (see the top of the file).
  if (p < top_k * rp) {
    int j = p / rp;
    long long r = t * top_k + j;
    k0 = (p - j * rp) * piece;
    len = min(piece, inter - k0);
    ld = inter;
    w = w_down + ((long long)ids[r] * width + o0) * inter + k0;
    hp = h + r * inter + k0;
    wt = weights[r];
  } else {
    k0 = (p - top_k * rp) * piece;
    len = min(piece, s_inter - k0);
    ld = s_inter;
    w = ws_down + (long long)o0 * s_inter + k0;
    hp = hs + t * s_inter + k0;
    wt = 1.f;
  }
  // Rows, piece starts and lengths in whole 16-byte chunks (inter and s_inter multiples of 8).
  bool vec = ((ld | len | k0) & 7) == 0;
  int nc = len >> 3;
  float acc[NM_DOWN_ROWS];
#pragma unroll
  for (int r = 0; r < NM_DOWN_ROWS; r++) acc[r] = 0.f;
  Vec8<T> wv[NM_DOWN_ROWS][U];
  if (vec) nm_down_load<U, T>(wv, w, ld, live, lane, nc);
  pdl_wait();  // h, hs and the counters are the up kernel's
  pdl_trigger();
  if (vec) {
    for (int c = threadIdx.x; c < nc; c += blockDim.x) {
      Vec8<float> v;
      v.load(hp + c * 8);
      v.store(s_h + c * 8);
    }
  } else {
    for (int c = threadIdx.x; c < len; c += blockDim.x) s_h[c] = hp[c];
  }
  __syncthreads();
  if (vec) {
    for (int c0 = lane; c0 < nc; c0 += 32 * U) {
      if (c0 != lane) nm_down_load<U, T>(wv, w, ld, live, c0, nc);
#pragma unroll
      for (int u = 0; u < U; u++) {
        int c = c0 + 32 * u;
        if (c < nc) {
          float hf[8];
          Vec8<float> hv;
          hv.load(s_h + c * 8);
          hv.to_float(hf);
#pragma unroll
          for (int r = 0; r < NM_DOWN_ROWS; r++) {
            if (r < live) {
              float wf[8];
              wv[r][u].to_float(wf);
#pragma unroll
              for (int i = 0; i < 8; i++) acc[r] += wf[i] * hf[i];
            }
          }
        }
      }
    }
  } else {
    for (int r = 0; r < NM_DOWN_ROWS; r++)
      if (r < live)
        for (int c = lane; c < len; c += 32) acc[r] += to_f32(w[r * ld + c]) * s_h[c];
  }
  float* pp = part + (t * gridDim.y + p) * width;
#pragma unroll
  for (int r = 0; r < NM_DOWN_ROWS; r++) {
    float v = nm_warp_sum(acc[r]);
    if (lane == 0 && r < live) pp[o0 + r] = v * wt;
  }
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0)
    s_last = atomicAdd(cnt + t * gridDim.x + tile, 1) == (int)gridDim.y - 1;
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  for (int i = threadIdx.x; i < NM_DOWN_TILE; i += blockDim.x) {
    int o = tile * NM_DOWN_TILE + i;
    if (o >= width) break;
    const float* q = part + t * gridDim.y * width + o;
    float total = 0.f;
#pragma unroll 4
    for (int k = 0; k < (int)gridDim.y; k++) total += __ldcg(q + (long long)k * width);
    out[t * width + o] = from_f32<T>(total);
  }
}

// Grid (ceil(width / 256), num_tokens): out[t, o] = sum_j weights[t, j] * rows[pos[t, j], o],
// rows holding every (token, expert) pair's expert output (the grouped prefill path).
template <typename T>
__device__ void nm_combine_impl(T* out, const T* rows, const float* weights, const int* pos,
                                int width, int top_k) {
  int o = blockIdx.x * blockDim.x + threadIdx.x;
  long long t = blockIdx.y;
  if (o >= width) return;
  float total = 0.f;
  for (int j = 0; j < top_k; j++)
    total += weights[t * top_k + j] * to_f32(rows[(long long)pos[t * top_k + j] * width + o]);
  out[t * width + o] = from_f32<T>(total);
}

#define NEMOTRON_MOE(T, S)                                                                    \
  extern "C" __global__ void nemotron_h_moe_logits_##S(float* logits, const T* x,             \
                                                       const float* w, int ntok, int hidden,  \
                                                       int E) {                               \
    nm_logits_impl<T>(logits, x, w, ntok, hidden, E);                                         \
  }                                                                                           \
  extern "C" __global__ void nemotron_h_moe_select_##S(                                       \
      float* wt, int* ids, const float* logits, const float* bias, int E, int k, int n_group, \
      int topk_group, int renorm, float scale) {                                              \
    nm_select_impl(wt, ids, logits, bias, E, k, n_group, topk_group, renorm, scale);          \
  }                                                                                           \
  extern "C" __global__ void nemotron_h_moe_route1_##S(                                       \
      float* wt, int* ids, float* logits, int* counters, const T* x, const float* w,          \
      const float* bias, int ntok, int hidden, int E, int k, int renorm, float scale) {       \
    nm_route1_impl<T>(wt, ids, logits, counters, x, w, bias, ntok, hidden, E, k, renorm,      \
                      scale);                                                                 \
  }                                                                                           \
  extern "C" __global__ void nemotron_h_moe_up_##S(                                           \
      float* h, float* hs, int* cnt, const T* x, const T* w_up, const T* ws_up,               \
      const int* ids, int ntok, int width, int inter, int s_inter, int k, int n_cnt) {        \
    nm_up_impl<T>(h, hs, cnt, x, w_up, ws_up, ids, ntok, width, inter, s_inter, k, n_cnt);    \
  }                                                                                           \
  extern "C" __global__ void __launch_bounds__(32 * NM_WARPS) nemotron_h_moe_down_##S(        \
      T* out, float* part, int* cnt, const float* h, const T* w_down, const float* wt,        \
      const int* ids, const float* hs, const T* ws_down, int width, int inter, int s_inter,   \
      int k, int piece) {                                                                     \
    nm_down_impl<T>(out, part, cnt, h, w_down, wt, ids, hs, ws_down, width, inter, s_inter,   \
                    k, piece);                                                                \
  }                                                                                           \
  extern "C" __global__ void nemotron_h_moe_combine_##S(T* out, const T* rows, const float* wt, \
                                                        const int* pos, int width, int k) {   \
    nm_combine_impl<T>(out, rows, wt, pos, width, k);                                         \
  }
INSTANTIATE(NEMOTRON_MOE)
