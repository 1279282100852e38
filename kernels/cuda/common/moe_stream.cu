// Decode MoE block (at most 8 tokens) in two kernels, launched with PDL on sm_90+ (opt-in,
// ATLAS_CUDA_MOE_DECODE=stream: slower than moe_decode.cu on an H200 so far, see ops_moe.py):
//   moe_logits: the router GEMV (a warp per expert row, plus the shared-expert gate row), logits
//               rounded to the activation dtype as `linear` rounds them; each warp loads its
//               static row before griddepcontrol.wait.
//   moe_stream: one persistent block per SM. Every block picks the top-k itself (a warp per
//               token, from the logits), then its warps walk one global list of work items in
//               round-robin order: gate_up rows (shared expert first, then each distinct chosen
//               expert with all of its tokens), then down tiles (R output rows of one expert),
//               which start as soon as their expert's gate_up rows are counted done. A down tile
//               writes weighted float32 partials; the last tile of a (token, rows) group sums
//               them in slot order (deterministic) and writes the output.
// Every warp depends only on items earlier in the list, and the grid never exceeds one block
// per SM, so all blocks are resident and the spin-waits always finish.
#include "common.cuh"
#include "moe_topk.cuh"

#define MS_MAX_TOKENS 8
#define MS_MAX_PAIRS 256
#define MS_DONE 32      // sync[MS_DONE + 8 * slot + j]: gate_up rows done (8 counters per slot)
#define MS_TILES 2112   // sync[MS_TILES + t * tiles + tile]: down partials written
#define MS_CH 8         // 16-byte chunks per row per lane in one gate_up batch (H <= 2048)

__device__ __forceinline__ void ms_prefetch(const void* p) {
  asm volatile("prefetch.global.L2 [%0];\n" :: "l"(p));
}
// Loads of data other blocks of this grid wrote: from L2, never a stale L1 line.
__device__ __forceinline__ void ms_ldcg8(float* f, const float* p) {
  asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(f[0]), "=f"(f[1]), "=f"(f[2]), "=f"(f[3]) : "l"(p) : "memory");
  asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(f[4]), "=f"(f[5]), "=f"(f[6]), "=f"(f[7]) : "l"(p + 4) : "memory");
}
// Grid ceil(rows / 4) x 128 threads, rows = E (+1 with a shared gate): logits[t, r].
template <typename T>
__device__ void moe_logits_impl(float* logits, const T* __restrict__ x, const T* __restrict__ wr,
                                const T* __restrict__ wsg, int ntok, int E, int H) {
  int lane = threadIdx.x & 31, rows = E + (wsg ? 1 : 0);
  int r = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  pdl_trigger();
  if (r >= rows) return;
  const T* wrow = r < E ? wr + (long long)r * H : wsg;
  Vec8<T> pre[MS_CH];
#pragma unroll
  for (int c = 0; c < MS_CH; c++) {
    int k = (lane + 32 * c) * 8;
    if (k < H) pre[c].load(wrow + k);
  }
  pdl_wait();
  moe_row_logits<T, MS_CH, MS_MAX_TOKENS>(logits, pre, wrow, x, ntok, H, rows, r);
}

struct MsSmem {
  float w[MS_MAX_PAIRS];                        // routing weight of each (token, slot) pair
  int ids[MS_MAX_PAIRS];                        // expert of each pair
  float sw[MS_MAX_TOKENS];                      // shared expert scale of each token
  int slot_e[MS_MAX_PAIRS];                     // expert of each distinct-expert slot
  int slot_n[MS_MAX_PAIRS];                     // its tokens
  unsigned char slot_p[MS_MAX_PAIRS][MS_MAX_TOKENS];  // their pairs
  int map[1024];                                // expert -> slot (several tokens)
  int nslots;
};

struct MsArgs {
  int ntok, E, top_k, H, I, Is, gelu, tiles;
};

// Routing of every token into shared memory (each block computes the same, deterministically).
__device__ void ms_route(MsSmem& s, const float* logits, const MsArgs& a, int has_sgate,
                         int renorm, int sigmoid) {
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, rows = a.E + has_sgate;
  if (warp < a.ntok) {
    const float* lg = logits + warp * rows;
    float* wt = s.w + warp * a.top_k;
    int* it = s.ids + warp * a.top_k;
    if (a.E <= 128) ms_topk<4>(wt, it, lg, a.E, a.top_k, renorm, sigmoid);
    else if (a.E <= 256) ms_topk<8>(wt, it, lg, a.E, a.top_k, renorm, sigmoid);
    else ms_topk<32>(wt, it, lg, a.E, a.top_k, renorm, sigmoid);
    if (lane == 0) s.sw[warp] = has_sgate ? 1.f / (1.f + expf(-lg[a.E])) : 1.f;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int n = 0;
    for (int p = 0; p < a.ntok * a.top_k; p++) {
      int e = s.ids[p], u = a.ntok == 1 ? -1 : s.map[e];
      if (u < 0) {
        u = n++;
        if (a.ntok > 1) s.map[e] = u;
        s.slot_e[u] = e;
        s.slot_n[u] = 0;
      }
      s.slot_p[u][s.slot_n[u]++] = (unsigned char)p;
    }
    s.nslots = n;
  }
  __syncthreads();
}

// Gate_up item: row n of one slot for each of its tokens, h = act(x . gate) * (x . up).
template <typename T>
__device__ void ms_gate_up(float* h, float* hs, const T* __restrict__ x, const T* wgate,
                           const MsSmem& s, const MsArgs& a, int slot, int n, int* done) {
  int lane = threadIdx.x & 31;
  bool sh = slot < 0;
  int inter = sh ? a.Is : a.I, m = sh ? a.ntok : s.slot_n[slot];
  const T* wup = wgate + (long long)inter * a.H;
  float g[MS_MAX_TOKENS], u[MS_MAX_TOKENS];
#pragma unroll
  for (int q = 0; q < MS_MAX_TOKENS; q++) { g[q] = 0.f; u[q] = 0.f; }
  for (int k0 = 0; k0 < a.H; k0 += 256 * MS_CH) {
    Vec8<T> gv[MS_CH], uv[MS_CH];
#pragma unroll
    for (int c = 0; c < MS_CH; c++) {
      int k = k0 + (lane + 32 * c) * 8;
      if (k < a.H) { gv[c].load(wgate + k); uv[c].load(wup + k); }
    }
#pragma unroll
    for (int q = 0; q < MS_MAX_TOKENS; q++) {
      if (q >= m) continue;
      int t = sh ? q : s.slot_p[slot][q] / a.top_k;
      const T* xr = x + (long long)t * a.H;
#pragma unroll
      for (int c = 0; c < MS_CH; c++) {
        int k = k0 + (lane + 32 * c) * 8;
        if (k >= a.H) continue;
        float xf[8], gf[8], uf[8];
        Vec8<T> xv; xv.load(xr + k); xv.to_float(xf);
        gv[c].to_float(gf); uv[c].to_float(uf);
#pragma unroll
        for (int i = 0; i < 8; i++) { g[q] += xf[i] * gf[i]; u[q] += xf[i] * uf[i]; }
      }
    }
  }
#pragma unroll
  for (int q = 0; q < MS_MAX_TOKENS; q++) {
    if (q >= m) continue;
    float gs = warp_sum(g[q]), us = warp_sum(u[q]);
    if (lane == 0) {
      float* dst = sh ? hs + (long long)q * a.Is : h + (long long)s.slot_p[slot][q] * a.I;
      dst[n] = gated_act(gs, a.gelu) * us;
    }
  }
  if (lane == 0) {
    __threadfence();
    atomicAdd(done, 1);
  }
}

// Waits until `need` gate_up rows of a slot are done (its 8 counters summed).
__device__ void ms_wait_rows(const int* done, int need) {
  int lane = threadIdx.x & 31;
  while (true) {
    int v = lane < 8 ? *(const volatile int*)(done + lane) : 0;
#pragma unroll
    for (int o = 4; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (__shfl_sync(0xffffffffu, v, 0) >= need) break;
#if __CUDA_ARCH__ >= 700
    __nanosleep(100);
#endif
  }
  __threadfence();
}

// out[t, rows] = sum_j part[t * k + j, rows] (+ the shared expert's part), slots in order.
template <typename T, int R>
__device__ void ms_combine(T* out, const float* part, const MsArgs& a, int t, int row0) {
  int lane = threadIdx.x & 31, row = row0 + lane;
  if (lane >= R || row >= a.H) return;
  float total = 0.f;
#pragma unroll 8
  for (int j = 0; j < a.top_k; j++) total += ms_ldcg(part + (long long)(t * a.top_k + j) * a.H + row);
  if (a.Is) total += ms_ldcg(part + (long long)(a.ntok * a.top_k + t) * a.H + row);
  out[(long long)t * a.H + row] = from_f32<T>(total);
}

// Down item: R output rows of one slot's down matrix [H, inter] for each of its tokens.
template <typename T, int R>
__device__ void ms_down(T* out, const float* h, const float* hs, float* part, int* sync,
                        const T* base, const MsSmem& s, const MsArgs& a, int slot, int tile) {
  constexpr int CB = 16 / R;
  int lane = threadIdx.x & 31, row0 = tile * R;
  bool sh = slot < 0;
  int inter = sh ? a.Is : a.I, m = sh ? a.ntok : s.slot_n[slot];
  Vec8<T> wv[R][CB];
  for (int q = 0; q < m; q++) {
    // Loaded again for each further token (L1 hits): keeps the kernel within 128 registers.
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
      for (int c = 0; c < CB; c++) {
        int k = (lane + 32 * c) * 8;
        if (k < inter) wv[r][c].load(base + (long long)min(row0 + r, a.H - 1) * inter + k);
      }
    if (q == 0) ms_wait_rows(sync + MS_DONE + 8 * (slot + 1), inter);
    int p = sh ? a.ntok * a.top_k + q : s.slot_p[slot][q];
    int t = sh ? q : p / a.top_k;
    const float* hr = sh ? hs + (long long)q * a.Is : h + (long long)p * a.I;
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; r++) acc[r] = 0.f;
#pragma unroll
    for (int c = 0; c < CB; c++) {
      int k = (lane + 32 * c) * 8;
      if (k >= inter) continue;
      float hf[8];
      ms_ldcg8(hf, hr + k);
#pragma unroll
      for (int r = 0; r < R; r++) {
        float wf[8];
        wv[r][c].to_float(wf);
#pragma unroll
        for (int i = 0; i < 8; i++) acc[r] += wf[i] * hf[i];
      }
    }
    float scale = sh ? s.sw[q] : s.w[p];
    int last = 0;
#pragma unroll
    for (int r = 0; r < R; r++) acc[r] = warp_sum(acc[r]);
    if (lane == 0) {
#pragma unroll
      for (int r = 0; r < R; r++)
        if (row0 + r < a.H) part[(long long)p * a.H + row0 + r] = scale * acc[r];
      __threadfence();
      int* cnt = sync + MS_TILES + t * a.tiles + tile;
      last = atomicAdd(cnt, 1) == a.top_k + (a.Is ? 1 : 0) - 1;
      if (last) *cnt = 0;
    }
    if (__shfl_sync(0xffffffffu, last, 0)) {
      __threadfence();
      ms_combine<T, R>(out, part, a, t, row0);
    }
  }
}

template <typename T, int R>
__device__ void moe_stream_impl(T* out, float* h, float* hs, float* part, int* sync,
                                const T* __restrict__ x, const float* logits, const T* w,
                                const T* wd, const T* ws, const T* wsd, MsArgs a, int has_sgate,
                                int renorm, int sigmoid) {
  __shared__ MsSmem s;
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
  int wg = blockIdx.x * nw + warp, W = gridDim.x * nw;
  if (a.Is && wg < a.Is)  // this warp's first item is a (static) shared-expert row
    for (int k = lane * 64; k < a.H; k += 32 * 64) {
      ms_prefetch(ws + (long long)wg * a.H + k);
      ms_prefetch(ws + (long long)(a.Is + wg) * a.H + k);
    }
  if (a.ntok > 1)
    for (int e = threadIdx.x; e < a.E; e += blockDim.x) s.map[e] = -1;
  pdl_wait();
  pdl_trigger();
  ms_route(s, logits, a, has_sgate, renorm, sigmoid);
  int G = a.Is + s.nslots * a.I, D = (s.nslots + (a.Is ? 1 : 0)) * a.tiles;
  int i = wg;
  for (; i < G; i += W) {
    int slot = i < a.Is ? -1 : (i - a.Is) / a.I, n = i < a.Is ? i : (i - a.Is) % a.I;
    const T* wg_row = slot < 0 ? ws + (long long)n * a.H
                               : w + ((long long)s.slot_e[slot] * 2 * a.I + n) * a.H;
    ms_gate_up<T>(h, hs, x, wg_row, s, a, slot, n, sync + MS_DONE + 8 * (slot + 1) + (wg & 7));
  }
  for (; i < G + D; i += W) {
    int d = i - G, st = a.Is ? a.tiles : 0;
    int slot = d < st ? -1 : (d - st) / a.tiles, tile = d < st ? d : (d - st) % a.tiles;
    const T* base = slot < 0 ? wsd : wd + (long long)s.slot_e[slot] * a.H * a.I;
    ms_down<T, R>(out, h, hs, part, sync, base, s, a, slot, tile);
  }
  // The last block out zeroes the gate_up counters for the next call.
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(sync, 1) == (int)gridDim.x - 1) {
      for (int i = 0; i < 8 * (s.nslots + 1); i++) sync[MS_DONE + i] = 0;
      sync[0] = 0;
    }
  }
}

#define MOE_STREAM_R(T, S, R)                                                                  \
  extern "C" __global__ void __launch_bounds__(512, 1) moe_stream_r##R##_##S(                  \
      T* out, float* h, float* hs, float* part, int* sync, const T* x, const float* logits,    \
      const T* w, const T* wd, const T* ws, const T* wsd, int ntok, int E, int k, int H,       \
      int I, int Is, int gelu, int tiles, int has_sgate, int renorm, int sig) {                \
    MsArgs a = {ntok, E, k, H, I, Is, gelu, tiles};                                            \
    moe_stream_impl<T, R>(out, h, hs, part, sync, x, logits, w, wd, ws, wsd, a, has_sgate,     \
                          renorm, sig);                                                        \
  }
#define MOE_STREAM(T, S)                                                                       \
  extern "C" __global__ void moe_logits_##S(float* logits, const T* x, const T* wr,            \
                                            const T* wsg, int ntok, int E, int H) {            \
    moe_logits_impl<T>(logits, x, wr, wsg, ntok, E, H);                                        \
  }                                                                                            \
  MOE_STREAM_R(T, S, 2) MOE_STREAM_R(T, S, 4) MOE_STREAM_R(T, S, 8)
INSTANTIATE(MOE_STREAM)
