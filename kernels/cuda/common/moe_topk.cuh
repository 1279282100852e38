// Shared pieces of the MoE kernels (moe.cu's routing, moe_decode.cu, moe_block.cu): the warp
// top-k of one token's logits, the gate/up row dot, the per-pair gate_up kernel body and the
// weighted expert down sum.
#pragma once
// Needs common.cuh included before it (the NVRTC inliner has no include guards).

__device__ __forceinline__ float ms_ldcg(const float* p) {  // L2: another block may have written it
  float v;
  asm volatile("ld.global.cg.f32 %0, [%1];\n" : "=f"(v) : "l"(p) : "memory");
  return v;
}
// A router logit stored in the activation dtype (a separate router GEMV's output), from L2.
template <typename L>
__device__ __forceinline__ float ms_ldcg(const L* p) {
  L v;
  asm volatile("ld.global.cg.u16 %0, [%1];\n" : "=h"(v.x) : "l"(p) : "memory");
  return to_f32(v);
}
// Max (MAX) or min of v over the warp.
template <bool MAX>
__device__ __forceinline__ u32 ms_reduce_u32(u32 v) {
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
__device__ __forceinline__ void moe_prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];\n" :: "l"(p));
}
// Ask L2 for the gate and up rows n of the shared expert (ws [2 * Is, H]) before a PDL wait.
template <typename T>
__device__ __forceinline__ void moe_prefetch_shared_gate_up(const T* ws, int n, int H, int Is,
                                                            int lane) {
  const T* wg = ws + (long long)n * H;
  for (int k = lane * 64; k < H; k += 32 * 64) {
    moe_prefetch_l2(wg + k);
    moe_prefetch_l2(wg + (long long)Is * H + k);
  }
}
// The lane's part of x . gate_row and x . up_row (no warp sum), GC 256-element chunks of both
// rows in flight at a time.
template <typename T, int GC>
__device__ __forceinline__ void moe_gate_up_dot(float& g, float& u, const T* wg, const T* wu,
                                                const T* xr, int H, int lane) {
  for (int k0 = 0; k0 < H; k0 += GC * 256) {
    Vec8<T> gv[GC], uv[GC], xv[GC];
#pragma unroll
    for (int c = 0; c < GC; c++) {
      int k = k0 + c * 256 + lane * 8;
      if (k < H) { gv[c].load(wg + k); uv[c].load(wu + k); xv[c].load(xr + k); }
    }
#pragma unroll
    for (int c = 0; c < GC; c++) {
      int k = k0 + c * 256 + lane * 8;
      if (k >= H) break;
      float xf[8], gf[8], uf[8];
      xv[c].to_float(xf); gv[c].to_float(gf); uv[c].to_float(uf);
#pragma unroll
      for (int i = 0; i < 8; i++) { g += xf[i] * gf[i]; u += xf[i] * uf[i]; }
    }
  }
}

// Top-k of one token's logits (float, bf16 or f16) by a warp (PL experts per lane,
// E <= 32 * PL, top_k <= 32): descending weights, ties to the lower expert, like
// atlas_core.ops.moe.moe_route. Scores are >= 0, so their bits order as unsigned keys; key 0
// marks a taken (or absent) expert. Lane j < top_k gets slot j's final weight and expert.
// With pub, slot j's expert is also stored to pub[j] as soon as round j has picked it and
// *ready is then set to j + 1 (shared memory: the block's other warps may start on slot j).
template <int PL, typename L = float>
__device__ void ms_topk_lanes(float& out_w, int& out_id, const L* lg, int E, int top_k,
                              int renorm, int sigmoid, int* pub = nullptr,
                              volatile int* ready = nullptr) {
  int lane = threadIdx.x & 31;
  u32 key[PL];
  float mx = NEG_INF;
#pragma unroll
  for (int i = 0; i < PL; i++) {
    int e = lane + 32 * i;
    float v = e < E ? ms_ldcg(lg + e) : NEG_INF;
    key[i] = __float_as_uint(v);
    mx = fmaxf(mx, v);
  }
  mx = warp_max(mx);
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < PL; i++) {
    float v = __uint_as_float(key[i]);
    float s = sigmoid ? 1.f / (1.f + expf(-v)) : expf(v - mx);
    bool ok = lane + 32 * i < E;
    sum += ok ? s : 0.f;
    key[i] = ok ? __float_as_uint(s) + 1u : 0u;
  }
  sum = sigmoid ? 1.f : warp_sum(sum);
  float my_w = 0.f;
  int my_id = 0;
  for (int j = 0; j < top_k; j++) {
    u32 best = 0u;
    int bi = 0;
#pragma unroll
    for (int i = 0; i < PL; i++)
      if (key[i] > best) { best = key[i]; bi = i; }
    u32 top = ms_reduce_u32<true>(best);
    u32 idx = ms_reduce_u32<false>(best == top ? (u32)(lane + 32 * bi) : 0xffffffffu);
#pragma unroll
    for (int i = 0; i < PL; i++)
      if ((u32)(lane + 32 * i) == idx) key[i] = 0u;
    if (lane == j) { my_w = __uint_as_float(top - 1u) / sum; my_id = (int)idx; }
    if (pub && lane == 0) {
      pub[j] = (int)idx;
      __threadfence_block();
      *ready = j + 1;
    }
  }
  float chosen = warp_sum(lane < top_k ? my_w : 0.f);
  out_w = renorm ? my_w / chosen : my_w;
  out_id = my_id;
}

template <int PL, typename L = float>
__device__ void ms_topk(float* weights, int* ids, const L* lg, int E, int top_k, int renorm,
                        int sigmoid) {
  float w;
  int id;
  ms_topk_lanes<PL, L>(w, id, lg, E, top_k, renorm, sigmoid);
  if ((int)(threadIdx.x & 31) < top_k) { weights[threadIdx.x & 31] = w; ids[threadIdx.x & 31] = id; }
}


// ms_topk_lanes for E <= 256 experts: 4 logits a lane up to 128 experts, else 8.
template <typename L>
__device__ __forceinline__ void ms_topk_e256(float& w, int& id, const L* lt, int E, int top_k,
                                             int renorm, int sig, int* pub = nullptr,
                                             volatile int* ready = nullptr) {
  if (E <= 128) ms_topk_lanes<4, L>(w, id, lt, E, top_k, renorm, sig, pub, ready);
  else ms_topk_lanes<8, L>(w, id, lt, E, top_k, renorm, sig, pub, ready);
}

// Warp 0 picks the top-k of one token's logits lt (E <= 256, top_k <= 8) into shared memory
// and the whole block waits for it: the logits are read from L2 once per block, not by every
// warp (thousands of warps reading the same few lines queue at one L2 slice).
template <typename L>
__device__ __forceinline__ void moe_block_topk(float* s_w, int* s_id, const L* lt, int E,
                                               int top_k, int renorm, int sig) {
  if (threadIdx.x < 32) {
    float w;
    int id;
    ms_topk_e256<L>(w, id, lt, E, top_k, renorm, sig);
    if ((int)threadIdx.x < top_k) { s_w[threadIdx.x] = w; s_id[threadIdx.x] = id; }
  }
  __syncthreads();
}

// Grid (ceil(max(I, Is) / warps), ntok * top_k (+ ntok with a shared expert)): a warp per
// (pair, intermediate row) writes act(x . gate_row) * (x . up_row) in float32, GC 256-element
// chunks of both rows in flight at a time. The pair's expert is ids[p] or, with LOGITS, the
// block's own top-k pick (E <= 256, top_k <= 8) from the token's router logits [ntok, rows] of
// type L (moe_block.cu: routing costs no kernel). The next PDL kernel is triggered only after
// the wait, so a down kernel may read the routing (or the logits) before its own wait.
// With wts (ids only), a pair of weight exactly 0 reads nothing and leaves its h row
// unwritten: expert parallelism gives other ranks' experts weight 0 (and id 0), and the down
// kernels (moe_down_lane) skip the same pairs, so they cost this rank no bytes.
template <typename T, int GC, bool LOGITS, typename L = float>
__device__ void moe_pair_gate_up(float* h, float* hs, const T* x, const T* __restrict__ w,
                                 const T* __restrict__ ws, const int* ids, const float* wts,
                                 const L* logits, int ntok, int top_k, int E, int rows,
                                 int renorm, int sig, int H, int I, int Is, int gelu) {
  __shared__ float s_w[8];
  __shared__ int s_id[8];
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int n = blockIdx.x * (blockDim.x >> 5) + warp, p = blockIdx.y;
  bool shared = p >= ntok * top_k;  // the same for the whole block
  int inter = shared ? Is : I, t = shared ? p - ntok * top_k : p / top_k;
  bool live = n < inter;
  const T* wg = shared ? ws + (long long)n * H : nullptr;
  if (shared && live) moe_prefetch_shared_gate_up(ws, n, H, Is, lane);
  pdl_wait();
  pdl_trigger();
  if (!shared) {
    int e;
    if constexpr (LOGITS) {
      moe_block_topk<L>(s_w, s_id, logits + (long long)t * rows, E, top_k, renorm, sig);
      e = s_id[p - t * top_k];
    } else {
      e = live ? ids[p] : 0;
      if (wts && wts[p] == 0.f) return;  // the whole block: p is blockIdx.y
    }
    wg = w + ((long long)e * 2 * I + n) * H;
  }
  if (!live) return;
  const T* wu = wg + (long long)inter * H;
  const T* xr = x + (long long)t * H;
  float g = 0.f, u = 0.f;
  moe_gate_up_dot<T, GC>(g, u, wg, wu, xr, H, lane);
  g = warp_sum(g); u = warp_sum(u);
  if (lane == 0) (shared ? hs + (long long)t * Is : h + (long long)p * I)[n] = gated_act(g, gelu) * u;
}

// The first 256 * CH weights of router row wrow into registers: called before the PDL wait
// (weights are static, so their DRAM latency overlaps the previous kernel's tail).
template <typename T, int CH>
__device__ __forceinline__ void moe_row_preload(Vec8<T> (&pre)[CH], const T* wrow, int H) {
  int lane = threadIdx.x & 31;
#pragma unroll
  for (int c = 0; c < CH; c++)
    if ((lane + 32 * c) * 8 < H) pre[c].load(wrow + (lane + 32 * c) * 8);
}

// Router row r for every token: logits[m * rows + r] = x[m] . wrow (rounded to T like linear).
// pre holds the row's first 256 * CH weights, loaded before the PDL wait (weights are static).
template <typename T, int CH, int MAXT>
__device__ __forceinline__ void moe_row_logits(float* logits, Vec8<T> (&pre)[CH],
                                               const T* __restrict__ wrow,
                                               const T* __restrict__ x, int ntok, int H, int rows,
                                               int r) {
  int lane = threadIdx.x & 31;
  float acc[MAXT];
#pragma unroll
  for (int m = 0; m < MAXT; m++) acc[m] = 0.f;
  for (int k0 = 0; k0 < H; k0 += 256 * CH) {
#pragma unroll
    for (int c = 0; c < CH; c++) {
      int k = k0 + (lane + 32 * c) * 8;
      if (k >= H) continue;
      if (k0) pre[c].load(wrow + k);
      float wf[8];
      pre[c].to_float(wf);
#pragma unroll
      for (int m = 0; m < MAXT; m++) {
        if (m >= ntok) continue;
        float xf[8];
        Vec8<T> xv; xv.load(x + (long long)m * H + k); xv.to_float(xf);
#pragma unroll
        for (int i = 0; i < 8; i++) acc[m] += wf[i] * xf[i];
      }
    }
  }
#pragma unroll
  for (int m = 0; m < MAXT; m++) {
    float v = warp_sum(acc[m]);
    if (lane == 0 && m < ntok) logits[m * rows + r] = to_f32(from_f32<T>(v));
  }
}

// This lane's share (warp_sum it) of one token's MoE output row n: sum over slots j < top_k of
// wt[j] * (down row n of expert e[j] . ht[j]) plus shared_w * (shared down row n . hs_t).
// ht holds the token's top_k float h rows of I; e / wt index like arrays (registers or global).
// NC > 0 (top_k <= 8, I <= NC * 256): every expert row's loads in flight at once; NC == 0: a
// loop over 256-column chunks. A slot of weight exactly 0 is skipped (neither its down row nor
// its h row is read: moe_pair_gate_up may have left that row unwritten); the other slots sum in
// the same order, so results are bit-identical wherever no weight is 0.
template <typename T, int NC, typename Ids, typename Wts>
__device__ __forceinline__ float moe_down_lane(const T* __restrict__ w, const float* ht,
                                               const Ids& e, const Wts& wt, int top_k, int H,
                                               int I, int n, const T* __restrict__ ws,
                                               const float* hs_t, int Is, float shared_w) {
  int lane = threadIdx.x & 31;
  float total = 0.f;
  if (NC > 0) {
    Vec8<T> wv[8][NC > 0 ? NC : 1];
#pragma unroll
    for (int j = 0; j < 8; j++)
#pragma unroll
      for (int c = 0; c < NC; c++) {
        int k = lane * 8 + c * 256;
        if (j < top_k && wt[j] != 0.f && k < I)
          wv[j][c].load(w + ((long long)e[j] * H + n) * I + k);
      }
#pragma unroll
    for (int j = 0; j < 8; j++) {
      if (j >= top_k) break;
      if (wt[j] == 0.f) continue;
      float s = 0.f;
#pragma unroll
      for (int c = 0; c < NC; c++) {
        int k = lane * 8 + c * 256;
        if (k < I) {
          float wf[8], hf[8];
          wv[j][c].to_float(wf);
          Vec8<float> hv; hv.load(ht + (long long)j * I + k); hv.to_float(hf);
#pragma unroll
          for (int i = 0; i < 8; i++) s += wf[i] * hf[i];
        }
      }
      total += s * wt[j];
    }
  } else {
    for (int k = lane * 8; k < I; k += 256) {
#pragma unroll 8
      for (int j = 0; j < top_k; j++) {
        if (wt[j] == 0.f) continue;
        float wf[8], hf[8], s = 0.f;
        Vec8<T> wv; wv.load(w + ((long long)e[j] * H + n) * I + k); wv.to_float(wf);
        Vec8<float> hv; hv.load(ht + (long long)j * I + k); hv.to_float(hf);
#pragma unroll
        for (int i = 0; i < 8; i++) s += wf[i] * hf[i];
        total += s * wt[j];
      }
    }
  }
  if (Is) {
    float s = 0.f;
    for (int k = lane * 8; k < Is; k += 256) {
      float wf[8], hf[8];
      Vec8<T> wv; wv.load(ws + (long long)n * Is + k); wv.to_float(wf);
      Vec8<float> hv; hv.load(hs_t + k); hv.to_float(hf);
#pragma unroll
      for (int i = 0; i < 8; i++) s += wf[i] * hf[i];
    }
    total += shared_w * s;
  }
  return total;
}
