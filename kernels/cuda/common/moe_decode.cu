// Decode MoE block (router: at most 8 tokens) in three kernels, launched with PDL on sm_90+;
// the two expert kernels also serve moe_experts' per-pair path for any token count:
//   moe_router:       router GEMV for every expert (and the shared-expert gate row), logits
//                     rounded to the activation dtype as the separate `linear` does; the last
//                     block to finish picks each token's top-k (a warp per token).
//   moe_dec_gate_up:  act(gate) * up for every (token, slot) pair and each token's shared expert.
//   moe_dec_down:     out = sum_j w_j * down_e(h_j) + sigmoid(gate) * shared_down(hs).
// A (token, slot) of weight exactly 0 costs neither expert kernel a byte (expert parallelism
// marks other ranks' experts so: weight 0, id 0); its h row is never written nor read.
// Static weights (and, in moe_dec_down for at most 8 tokens, the chosen experts' rows) are
// prefetched to L2 before griddepcontrol.wait, so they stream while the previous kernel drains.
#include "common.cuh"
#include "moe_topk.cuh"

#define MOE_DEC_MAX_TOKENS 8

__device__ __forceinline__ int load_cg(const int* p) {  // from L2: written by an earlier kernel
  int v;
  asm volatile("ld.global.cg.s32 %0, [%1];\n" : "=r"(v) : "l"(p));
  return v;
}

// Grid ceil(rows / warps), rows = E (+1 with a shared gate): a warp per row, every token.
template <typename T>
__device__ void moe_router_impl(float* weights, int* ids, float* shared_w, float* logits,
                                int* counter, const T* __restrict__ x, const T* __restrict__ wr,
                                const T* __restrict__ wsg, int ntok, int E, int H, int top_k,
                                int renorm, int sigmoid) {
  __shared__ int last;
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
  int rows = E + (wsg ? 1 : 0), r = blockIdx.x * nw + warp;
  const T* wrow = r < E ? wr + (long long)r * H : wsg;
  Vec8<T> pre[8];
  if (r < rows) moe_row_preload<T, 8>(pre, wrow, H);
  pdl_trigger();
  pdl_wait();
  if (r < rows) moe_row_logits<T, 8, MOE_DEC_MAX_TOKENS>(logits, pre, wrow, x, ntok, H, rows, r);
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(counter, 1) == (int)gridDim.x - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  const volatile float* lg = logits;
  for (int t = warp; t < ntok; t += nw) {
    float* wt = weights + t * top_k;
    int* it = ids + t * top_k;
    const float* lt = (const float*)(lg + t * rows);
    if (E <= 128) ms_topk<4>(wt, it, lt, E, top_k, renorm, sigmoid);
    else if (E <= 256) ms_topk<8>(wt, it, lt, E, top_k, renorm, sigmoid);
    else ms_topk<32>(wt, it, lt, E, top_k, renorm, sigmoid);
    if (wsg && lane == 0) shared_w[t] = 1.f / (1.f + expf(-lg[t * rows + E]));
  }
  if (threadIdx.x == 0) *counter = 0;
}

// Grid (ceil(H / warps), ntok): a warp per (token, hidden row) sums the token's experts (and
// its gated shared expert) and writes the block's output.
template <typename T, int NC>
__device__ void moe_dec_down_impl(T* out, const float* __restrict__ h, const float* __restrict__ hs,
                                  const T* __restrict__ w, const T* __restrict__ ws,
                                  const float* weights, const int* ids, const float* shared_w,
                                  int top_k, int H, int I, int Is, int pf) {
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int n = blockIdx.x * (blockDim.x >> 5) + warp, t = blockIdx.y;
  if (n >= H) return;
  // moe_dec_gate_up triggers only after its wait, so the router's ids are final here: with pf,
  // fetch this warp's expert rows into L2 while gate_up finishes (a few tokens; with many, the
  // prefetches double the L2 requests of loads that overlap well anyway). Slots of weight 0
  // are skipped (moe_down_lane does not read them).
  int lines = (I + 63) / 64;
  for (int q = lane; pf && q < top_k * lines; q += 32) {
    int e = load_cg(ids + t * top_k + q / lines);
    if (ms_ldcg(weights + t * top_k + q / lines) != 0.f)
      moe_prefetch_l2(w + ((long long)e * H + n) * I + (q % lines) * 64);
  }
  if (Is && pf)
    for (int k = lane * 64; k < Is; k += 32 * 64) moe_prefetch_l2(ws + (long long)n * Is + k);
  pdl_wait();
  pdl_trigger();
  const int* e = ids + t * top_k;
  const float* wt = weights + t * top_k;
  float total = moe_down_lane<T, NC>(w, h + (long long)t * top_k * I, e, wt, top_k, H, I, n, ws,
                                     hs + (long long)t * Is, Is, shared_w ? shared_w[t] : 1.f);
  total = warp_sum(total);
  if (lane == 0) out[(long long)t * H + n] = from_f32<T>(total);
}

// One token's down rows, DR a warp (policy moe_down=rows; top_k <= 8). Why: the warp-a-row
// kernels re-read the token's whole float h (top_k x I) for every output row, two 16-byte L1
// loads per 16 weight bytes, each a dependent round trip (ncu, gemma-4-26b-a4b: 13.5 cycles an
// issued instruction, 9 of them waiting on L1). Here a block stages h (and the shared expert's
// hs) in shared memory once, a warp owns DR rows, so each h slice read serves DR weight loads,
// and the chosen experts, their weights and the first 256 columns of every row are loaded
// before griddepcontrol.wait (static weights; the router finished before gate_up triggered).
#define MOE_DOWN_ROWS 2
template <typename T>
__device__ void moe_dec_down_rows_impl(T* out, const float* __restrict__ h,
                                       const float* __restrict__ hs, const T* __restrict__ w,
                                       const T* __restrict__ ws, const float* weights,
                                       const int* ids, const float* shared_w, int top_k, int H,
                                       int I, int Is) {
  constexpr int DR = MOE_DOWN_ROWS;
  extern __shared__ float4 sh4[];
  float* sh = reinterpret_cast<float*>(sh4);
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, t = blockIdx.y;
  int n0 = (blockIdx.x * (blockDim.x >> 5) + warp) * DR;
  int e[8];
  float wt[8];
#pragma unroll
  for (int j = 0; j < 8; j++) {
    e[j] = j < top_k ? load_cg(ids + t * top_k + j) : 0;
    wt[j] = j < top_k ? ms_ldcg(weights + t * top_k + j) : 0.f;
  }
  Vec8<T> wv[8][DR];
  auto issue = [&](int k) {
#pragma unroll
    for (int j = 0; j < 8; j++)
#pragma unroll
      for (int r = 0; r < DR; r++)
        if (wt[j] != 0.f && n0 + r < H && k < I)
          wv[j][r].load(w + ((long long)e[j] * H + n0 + r) * I + k);
  };
  issue(lane * 8);
  pdl_wait();
  pdl_trigger();
  const float4* ht = reinterpret_cast<const float4*>(h + (long long)t * top_k * I);
  for (int i = threadIdx.x; i < top_k * I / 4; i += blockDim.x) sh4[i] = __ldcg(ht + i);
  if (Is) {
    const float4* hst = reinterpret_cast<const float4*>(hs + (long long)t * Is);
    for (int i = threadIdx.x; i < Is / 4; i += blockDim.x) sh4[top_k * I / 4 + i] = __ldcg(hst + i);
  }
  __syncthreads();
  float acc[DR];
#pragma unroll
  for (int r = 0; r < DR; r++) acc[r] = 0.f;
  for (int k = lane * 8; k < I; k += 256) {
#pragma unroll
    for (int j = 0; j < 8; j++) {
      if (wt[j] == 0.f || k >= I) continue;
      float hf[8];
      const float4* hp = reinterpret_cast<const float4*>(sh + j * I + k);
      float4 a = hp[0], b = hp[1];
      hf[0] = a.x; hf[1] = a.y; hf[2] = a.z; hf[3] = a.w;
      hf[4] = b.x; hf[5] = b.y; hf[6] = b.z; hf[7] = b.w;
#pragma unroll
      for (int r = 0; r < DR; r++) {
        float wf[8], s = 0.f;
        wv[j][r].to_float(wf);
#pragma unroll
        for (int i = 0; i < 8; i++) s += wf[i] * hf[i];
        acc[r] += s * wt[j];
      }
    }
    if (k + 256 < I) issue(k + 256);
  }
  if (Is) {
    float sw = shared_w ? shared_w[t] : 1.f;
    for (int k = lane * 8; k < Is; k += 256) {
      const float* hp = sh + top_k * I + k;
#pragma unroll
      for (int r = 0; r < DR; r++) {
        if (n0 + r >= H) continue;
        float wf[8], s = 0.f;
        Vec8<T> v;
        v.load(ws + (long long)(n0 + r) * Is + k);
        v.to_float(wf);
#pragma unroll
        for (int i = 0; i < 8; i++) s += wf[i] * hp[i];
        acc[r] += sw * s;
      }
    }
  }
#pragma unroll
  for (int r = 0; r < DR; r++) {
    float v = warp_sum(acc[r]);
    if (lane == 0 && n0 + r < H) out[(long long)t * H + n0 + r] = from_f32<T>(v);
  }
}

// moe_dec_down_w<NC>: every chosen expert row's loads in flight at once (top_k <= 8,
// I <= NC * 256; policy moe_down=wide, or auto where its blocks fit one wave).
#define MOE_DEC_DOWN_WIDE(T, S, NC)                                                            \
  extern "C" __global__ void __launch_bounds__(256) moe_dec_down_w##NC##_##S(                  \
      T* out, const float* h, const float* hs, const T* w, const T* ws, const float* wts,      \
      const int* ids, const float* sw, int k, int H, int I, int Is, int pf) {                  \
    moe_dec_down_impl<T, NC>(out, h, hs, w, ws, wts, ids, sw, k, H, I, Is, pf);                \
  }
#define MOE_DECODE(T, S)                                                                       \
  extern "C" __global__ void moe_router_##S(float* wts, int* ids, float* sw, float* logits,    \
      int* counter, const T* x, const T* wr, const T* wsg, int ntok, int E, int H, int k,      \
      int renorm, int sig) {                                                                   \
    moe_router_impl<T>(wts, ids, sw, logits, counter, x, wr, wsg, ntok, E, H, k, renorm, sig);  \
  }                                                                                            \
  extern "C" __global__ void moe_dec_gate_up_##S(float* h, float* hs, const T* x, const T* w,  \
      const T* ws, const int* ids, const float* wts, int ntok, int k, int H, int I, int Is,    \
      int gelu) {                                                                              \
    moe_pair_gate_up<T, 4, false, float>(h, hs, x, w, ws, ids, wts, nullptr, ntok, k, 0, 0, 0, \
                                         0, H, I, Is, gelu);                                   \
  }                                                                                            \
  extern "C" __global__ void moe_dec_down_##S(T* out, const float* h, const float* hs,         \
      const T* w, const T* ws, const float* wts, const int* ids, const float* sw, int k, int H,\
      int I, int Is, int pf) {                                                                 \
    moe_dec_down_impl<T, 0>(out, h, hs, w, ws, wts, ids, sw, k, H, I, Is, pf);                 \
  }                                                                                            \
  MOE_DEC_DOWN_WIDE(T, S, 1) MOE_DEC_DOWN_WIDE(T, S, 2) MOE_DEC_DOWN_WIDE(T, S, 3)             \
  MOE_DEC_DOWN_WIDE(T, S, 4)                                                                   \
  extern "C" __global__ void __launch_bounds__(256, 2) moe_dec_down_rows_##S(T* out,           \
      const float* h, const float* hs, const T* w, const T* ws, const float* wts,              \
      const int* ids, const float* sw, int k, int H, int I, int Is, int pf) {                  \
    moe_dec_down_rows_impl<T>(out, h, hs, w, ws, wts, ids, sw, k, H, I, Is);                    \
  }
INSTANTIATE(MOE_DECODE)
