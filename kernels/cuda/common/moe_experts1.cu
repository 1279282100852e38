// One token's MoE experts (gate_up and down, and a shared expert) in ONE persistent kernel,
// launched with PDL after the router (mb_router's float logits or a router GEMV's logits in the
// activation dtype). Split into two kernels, the down kernel could not start its weight loads
// before every gate_up block had left its SM (it needs their registers), and each boundary cost
// a launch and a drain; here every warp, once its gate_up rows are done, issues the loads of
// its first down row and then waits at a grid-wide barrier for the other warps' gate_up rows,
// so the down weights stream right behind the gate_up weights.
//
// Grid: at most as many blocks of 8 warps as can be resident at once (the host sizes it from
// the kernel's occupancy), so the barrier cannot deadlock; the next PDL kernel is triggered only
// after the barrier, when every block of this grid is running.
//   1. warp 0 of every block picks the top-k from the logits (E <= 256, top_k <= 8); with
//      overlap it publishes each slot's expert in shared memory as soon as it is picked;
//   2. gate_up rows q of the Is shared rows, then the top_k * I routed rows:
//      h[j, n] = act(x . gate_row) * (x . up_row) in float32. overlap: the block's rows
//      q = blockIdx.x + m * gridDim.x go to its warps one at a time (a shared-memory counter),
//      a routed row waiting only for its own slot, so loads start during the selection
//      (H200 qwen3-30b-a3b batch 1: 391.8 -> 404.9 tok/s); else fixed rows q = warp + m * NW
//      after the whole top-k;
//   3. load the first down row's weights, then the block arrives and waits for every block:
//      sync is a 64-bit count that only grows (graph replays need no reset); each block reads
//      it at its start, adds one on arrival (a reduction, no round trip) and polls, with an
//      acquire load, until the count has grown by gridDim.x. No fence waits on the down-row
//      loads in flight: each warp fenced its h rows before issuing them;
//   4. every block copies h and hs into shared memory (dynamic, (top_k * I + Is) floats); down
//      rows n = warp, warp + NW, ...: out[n] = sum_j w_j * (down_e_j[n] . h_j)
//      + sigmoid(gate) * (shared_down[n] . hs).
#include "common.cuh"
#include "moe_topk.cuh"

__device__ __forceinline__ void ldcg8(float (&f)[8], const float* p) {  // L2 (other SMs wrote it)
  asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(f[0]), "=f"(f[1]), "=f"(f[2]), "=f"(f[3]) : "l"(p));
  asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(f[4]), "=f"(f[5]), "=f"(f[6]), "=f"(f[7]) : "l"(p + 4));
}

// Lane's share of v . hrow (shared memory) over the NC 256-element chunks of a row of width I.
template <typename T, int NC>
__device__ __forceinline__ float me1_dot(const Vec8<T> (&wv)[NC], const float* hrow, int I) {
  int lane = threadIdx.x & 31;
  float s = 0.f;
#pragma unroll
  for (int c = 0; c < NC; c++) {
    int k = lane * 8 + c * 256;
    if (k < I) {
      float wf[8];
      wv[c].to_float(wf);
      const float4* hp = reinterpret_cast<const float4*>(hrow + k);
      float4 a = hp[0], b = hp[1];
      s += wf[0] * a.x + wf[1] * a.y + wf[2] * a.z + wf[3] * a.w;
      s += wf[4] * b.x + wf[5] * b.y + wf[6] * b.z + wf[7] * b.w;
    }
  }
  return s;
}

__device__ __forceinline__ unsigned long long me1_ld_acquire(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.acquire.gpu.global.u64 %0, [%1];\n" : "=l"(v) : "l"(p) : "memory");
  return v;
}

template <typename T, int NC>
__device__ __forceinline__ void me1_load(Vec8<T> (&wv)[NC], const T* row, int I) {
  int lane = threadIdx.x & 31;
#pragma unroll
  for (int c = 0; c < NC; c++)
    if (lane * 8 + c * 256 < I) wv[c].load(row + lane * 8 + c * 256);
}

// NC: 256-element chunks of max(I, Is) (<= 4). GC: gate/up chunks in flight per warp. MB:
// blocks per SM the registers are held to (__launch_bounds__).
template <typename T, int NC, int GC, typename L>
__device__ void moe_experts1_impl(T* out, float* h, float* hs, const T* __restrict__ x,
                                  const T* __restrict__ wgu, const T* __restrict__ wd,
                                  const T* __restrict__ wsgu, const T* __restrict__ wsd,
                                  const L* logits, unsigned long long* sync, int top_k, int E,
                                  int rows, int renorm, int sig, int H, int I, int Is, int gelu,
                                  int overlap) {
  __shared__ float s_w[8];
  __shared__ int s_id[8];
  extern __shared__ __align__(16) float sh_h[];  // (top_k * I + Is) floats
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  unsigned nw = gridDim.x * (blockDim.x >> 5);
  int gw = blockIdx.x * (blockDim.x >> 5) + warp;
  // the barrier's count before this launch: every arrival of the launch before on this slot
  // happened in a kernel that has completed; this launch's blocks add gridDim.x in all
  __shared__ unsigned long long s_target;  // (shared memory: no register held to the barrier)
  __shared__ int s_ready, s_next;
  if (threadIdx.x == 0) {
    s_target = me1_ld_acquire(sync) + gridDim.x;
    s_ready = 0;
    s_next = 0;
  }
  __syncthreads();
  profile_stamp(0);
  pdl_wait();
  profile_stamp(1);
  if (!overlap) {
    moe_block_topk<L>(s_w, s_id, logits, E, top_k, renorm, sig);
  } else if (warp == 0) {  // publishes each slot's expert as soon as it is picked
    float w;
    int id;
    ms_topk_e256<L>(w, id, logits, E, top_k, renorm, sig, s_id, &s_ready);
    if (lane < top_k) s_w[lane] = w;  // read after the barrier's __syncthreads
  }
  profile_stamp(2);
  // gate_up rows q: the Is shared-expert rows first (they need no routing), then slot j's I
  // rows. overlap: the block's rows blockIdx.x, + gridDim.x, ... are handed out to its warps
  // one at a time, so the other warps start while warp 0 still picks the later slots (a
  // routed row waits only for its own slot) and warp 0 takes fewer rows; else a fixed warp
  // stride.
  int routed = top_k * I, gu = routed + Is;
  for (int k = 0;; k++) {
    int q = gw + k * (int)nw;
    if (overlap) {
      int next = 0;
      if (lane == 0) next = atomicAdd(&s_next, 1);
      q = blockIdx.x + __shfl_sync(0xffffffffu, next, 0) * gridDim.x;
    }
    if (q >= gu) break;
    bool sh = q < Is;
    int j = sh ? 0 : (q - Is) / I, n = sh ? q : q - Is - j * I;
    if (overlap && !sh) {
      while (*(volatile int*)&s_ready <= j) __nanosleep(32);
      __threadfence_block();
    }
    const T* wg = sh ? wsgu + (long long)n * H
                     : wgu + ((long long)((volatile int*)s_id)[j] * 2 * I + n) * H;
    float g = 0.f, u = 0.f;
    moe_gate_up_dot<T, GC>(g, u, wg, wg + (long long)(sh ? Is : I) * H, x, H, lane);
    g = warp_sum(g);
    u = warp_sum(u);
    if (lane == 0) (sh ? hs + n : h + (long long)j * I + n)[0] = gated_act(g, gelu) * u;
  }
  if (lane == 0) __threadfence();  // this warp's h rows, before the block arrives
  float shared_w = Is && rows > E ? 1.f / (1.f + expf(-ms_ldcg(logits + E))) : 1.f;
  bool first = true;
  for (int n = gw;; n += nw) {
    bool have = n < H;
    Vec8<T> wv[8][NC], sv[NC];
    if (have) {
#pragma unroll
      for (int j = 0; j < 8; j++)
        if (j < top_k) me1_load<T, NC>(wv[j], wd + ((long long)s_id[j] * H + n) * I, I);
      if (Is) me1_load<T, NC>(sv, wsd + (long long)n * Is, Is);
    }
    if (first) {  // the grid-wide barrier: every block's gate_up rows are written
      __syncthreads();
      profile_stamp(3);
      if (threadIdx.x == 0) {  // one arrival and one poller per block
        atomicAdd(sync, 1ull);  // no return value: a fire-and-forget reduction
        while (me1_ld_acquire(sync) < s_target) __nanosleep(64);
      }
      __syncthreads();
      profile_stamp(4);
      pdl_trigger();
      // every h row into shared memory once per block (L2 only: other SMs wrote them)
      for (int q = threadIdx.x * 8; q < gu; q += blockDim.x * 8) {
        float f[8];
        ldcg8(f, q < routed ? h + q : hs + (q - routed));
        reinterpret_cast<float4*>(sh_h + q)[0] = make_float4(f[0], f[1], f[2], f[3]);
        reinterpret_cast<float4*>(sh_h + q)[1] = make_float4(f[4], f[5], f[6], f[7]);
      }
      __syncthreads();
      profile_stamp(5);
      first = false;
    }
    if (!have) break;
    float total = 0.f;
#pragma unroll
    for (int j = 0; j < 8; j++)
      if (j < top_k) total += s_w[j] * me1_dot<T, NC>(wv[j], sh_h + j * I, I);
    if (Is) total += shared_w * me1_dot<T, NC>(sv, sh_h + routed, Is);
    total = warp_sum(total);
    if (lane == 0) out[n] = from_f32<T>(total);
  }
#ifdef ATLAS_PROFILE
  __syncthreads();
  profile_stamp(6);
#endif
}

// Suffix "" reads mb_router's float logits, "_t" logits in the activation dtype.
#define MOE_EXPERTS1_NC(T, S, L, LS, NC, GC, MB)                                               \
  extern "C" __global__ void __launch_bounds__(256, MB) moe_experts1##LS##_w##NC##_##S(        \
      T* out, float* h, float* hs, const T* x, const T* wgu, const T* wd, const T* wsgu,       \
      const T* wsd, const L* lg, unsigned long long* sync, int k, int E, int rows, int renorm, \
      int sig, int H, int I, int Is, int gelu, int ov) {                                       \
    moe_experts1_impl<T, NC, GC, L>(out, h, hs, x, wgu, wd, wsgu, wsd, lg, sync, k, E, rows,   \
                                    renorm, sig, H, I, Is, gelu, ov);                          \
  }
#define MOE_EXPERTS1_L(T, S, L, LS)                                                            \
  MOE_EXPERTS1_NC(T, S, L, LS, 1, 8, 2) MOE_EXPERTS1_NC(T, S, L, LS, 2, 8, 2)                  \
  MOE_EXPERTS1_NC(T, S, L, LS, 3, 8, 2) MOE_EXPERTS1_NC(T, S, L, LS, 4, 4, 1)
#define MOE_EXPERTS1(T, S) MOE_EXPERTS1_L(T, S, float, ) MOE_EXPERTS1_L(T, S, T, _t)
INSTANTIATE(MOE_EXPERTS1)
