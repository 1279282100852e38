// Decode MoE block (at most 8 tokens, top-k <= 8, at most 256 experts) in three PDL kernels with no completion
// counter and no one-block tail:
//   mb_router:   router logits (and the shared-expert gate logit), a warp per row, rounded to
//                the activation dtype as `linear` does. With a norm weight, every block first
//                normalises x (+ residual) itself, exactly as rms_norm stores it; block 0 writes
//                the summed residual and the normed rows (xn) that the expert kernels read.
//   mb_gate_up:  act(gate) * up of every (token, slot) pair and each token's shared expert; warp 0
//                of each block picks the token's top-k from the logits (a warp-parallel
//                selection, moe_topk.cuh), so routing costs no kernel of its own.
//   mb_down:     out = sum_j w_j * down_e(h_j) + sigmoid(gate) * shared_down(hs). Each block
//                picks the top-k before its PDL wait (the logits are final once mb_gate_up has
//                launched it) and may ask L2 for its expert rows while mb_gate_up still runs.
// The "_t" expert kernels read a separate router GEMV's logits in the activation dtype (plain
// MoE blocks after the fused norm + router GEMV). One token's experts may instead run as
// moe_experts1.cu's single kernel.
#include "common.cuh"
#include "moe_topk.cuh"
#include "norm_rows.cuh"

#define MB_MAX_TOKENS 8

// Grid ceil(rows / warps), rows = E (+1 with a shared gate): a warp per router row, every token.
// Dynamic shared memory ntok * H elements when nw (the norm weight) is given.
template <typename T>
__device__ void mb_router_impl(float* logits, T* xn, T* r_out, const T* x, const T* res,
                               const T* nw, float eps, int zc, const T* __restrict__ wr,
                               const T* __restrict__ wsg, int ntok, int E, int H) {
  extern __shared__ __align__(16) unsigned char mb_smem[];
  int rows = E + (wsg ? 1 : 0);
  int r = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const T* wrow = r < E ? wr + (long long)r * H : wsg;
  Vec8<T> pre[8];
  if (r < rows) moe_row_preload<T, 8>(pre, wrow, H);
  pdl_trigger();
  pdl_wait();
  const T* xs = x;
  if (nw) {
    T* s = reinterpret_cast<T*>(mb_smem);
    norm_rows_to_shared<T, MB_MAX_TOKENS>(s, r_out, xn, x, res, nw, eps, zc, ntok, H, 0);
    xs = s;
  }
  if (r < rows) moe_row_logits<T, 8, MB_MAX_TOKENS>(logits, pre, wrow, xs, ntok, H, rows, r);
}

// Grid (ceil(H / warps), ntok): a warp per (token, hidden row) sums the token's experts and its
// gated shared expert. NC > 0 (I <= NC * 256): every expert row's loads in flight at once;
// NC == 0: a loop over 256-column chunks. pf: ask L2 for the rows before the PDL wait.
template <typename T, int NC, typename L>
__device__ void mb_down_impl(T* out, const float* __restrict__ h, const float* __restrict__ hs,
                             const T* __restrict__ w, const T* __restrict__ ws, const L* logits,
                             int top_k, int E, int rows, int renorm, int sig, int H, int I,
                             int Is, int pf) {
  __shared__ float s_w[8];
  __shared__ int s_id[8];
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int n = blockIdx.x * (blockDim.x >> 5) + warp, t = blockIdx.y;
  const L* lt = logits + (long long)t * rows;
  moe_block_topk<L>(s_w, s_id, lt, E, top_k, renorm, sig);
  if (n >= H) return;
  float wt[8];
  int e[8];
#pragma unroll
  for (int j = 0; j < 8; j++) {
    wt[j] = j < top_k ? s_w[j] : 0.f;
    e[j] = j < top_k ? s_id[j] : 0;
  }
  float shared_w = Is && rows > E ? 1.f / (1.f + expf(-ms_ldcg(lt + E))) : 1.f;
  if (pf) {
#pragma unroll
    for (int j = 0; j < 8; j++)
      if (j < top_k)
        for (int k = lane * 64; k < I; k += 32 * 64)
          moe_prefetch_l2(w + ((long long)e[j] * H + n) * I + k);
    if (Is)
      for (int k = lane * 64; k < Is; k += 32 * 64) moe_prefetch_l2(ws + (long long)n * Is + k);
  }
  pdl_wait();
  pdl_trigger();
  float total = moe_down_lane<T, NC>(w, h + (long long)t * top_k * I, e, wt, top_k, H, I, n, ws,
                                     hs + (long long)t * Is, Is, shared_w);
  total = warp_sum(total);
  if (lane == 0) out[(long long)t * H + n] = from_f32<T>(total);
}

// Suffix "" reads the float logits of mb_router, "_t" the activation-dtype logits of a
// separate router GEMV (plain MoE blocks: the fused norm + router GEMV of gemv_norm.cu).
#define MB_GATE_UP(T, S, L, LS)                                                                \
  extern "C" __global__ void __launch_bounds__(256) mb_gate_up##LS##_c4_##S(                   \
      float* h, float* hs, const T* x, const T* w, const T* ws, const L* lg, int ntok, int k,  \
      int E, int rows, int renorm, int sig, int H, int I, int Is, int gelu) {                 \
    moe_pair_gate_up<T, 4, true, L>(h, hs, x, w, ws, nullptr, nullptr, lg, ntok, k, E, rows,   \
                                    renorm, sig, H, I, Is, gelu);                              \
  }
#define MB_DOWN(T, S, L, LS, NC)                                                               \
  extern "C" __global__ void __launch_bounds__(256) mb_down##LS##_w##NC##_##S(                 \
      T* out, const float* h, const float* hs, const T* w, const T* ws, const L* lg, int k,    \
      int E, int rows, int renorm, int sig, int H, int I, int Is, int pf) {                    \
    mb_down_impl<T, NC, L>(out, h, hs, w, ws, lg, k, E, rows, renorm, sig, H, I, Is, pf);      \
  }
#define MB_EXPERTS(T, S, L, LS)                                                                \
  MB_GATE_UP(T, S, L, LS) MB_DOWN(T, S, L, LS, 0) MB_DOWN(T, S, L, LS, 1)                      \
  MB_DOWN(T, S, L, LS, 2) MB_DOWN(T, S, L, LS, 3) MB_DOWN(T, S, L, LS, 4)
#define MOE_BLOCK(T, S)                                                                        \
  extern "C" __global__ void mb_router_##S(float* lg, T* xn, T* r_out, const T* x,             \
      const T* res, const T* nw, float eps, int zc, const T* wr, const T* wsg, int ntok,       \
      int E, int H) {                                                                          \
    mb_router_impl<T>(lg, xn, r_out, x, res, nw, eps, zc, wr, wsg, ntok, E, H);                \
  }                                                                                            \
  MB_EXPERTS(T, S, float, ) MB_EXPERTS(T, S, T, _t)
INSTANTIATE(MOE_BLOCK)
