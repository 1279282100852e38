// Streamed decode GEMVs (M <= 4 rows of x, K a multiple of 256), a few blocks per SM:
//   gemvs_*_m{MT}           y = x @ W^T (+ bias)
//   gemvs_norm_*_m{MT}      y = rms_norm(x (+ residual)) @ W^T (+ bias)   (rms_norm_linear)
//   gemvs_norm_act_*_m{MT}  y = act(h @ Wg^T + bg) * (h @ Wu^T + bu), h the normed rows
// Weight rows come in groups of RG = STAGE_EL / K rows (K <= STAGE_EL; else a row is cut into
// pieces of STAGE_EL), one stage each; block b takes groups b, b + grid, b + 2 grid, ... so that
// at any moment all blocks read one narrow window of the matrix (blocks each sweeping their own
// far-apart slab reached only ~45% of the DRAM bandwidth). A block streams its stages (for the
// gated pair: a group's gate rows, then its up rows) through a ring of `nst` shared-memory
// stages with cp.async, one commit group a stage. The first stages are issued before
// griddepcontrol.wait: weights never depend on the previous kernel, so each SM has tens of KB of
// the next matrix in flight while the previous kernel drains.
// A stage is 32 granules of 256 elements (each inside one weight row, K % 256 == 0); warp w
// takes granules 4w .. 4w + 3, loading their weights and x before any math. Its partial dot
// products go to slot[row][warp] once it leaves a row, and the block sums the eight slots of a
// row in a fixed order at the end: deterministic, and the same for any MT.
#include "common.cuh"
#include "gemv_common.cuh"

constexpr int GS_WARPS = 8, GS_MAX_STAGES = 8, STAGE_EL = 8192, GPW = STAGE_EL / 256 / GS_WARPS;

__device__ __forceinline__ u32 smem_u32(const void* p) {
  u32 r;
  asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(r) : "l"(p));
  return r;
}
// Asynchronous 16-byte global -> shared copies (cp.async, sm_80+), committed as one group per
// stage; gs_wait(n) returns once at most n of this thread's groups are still in flight.
__device__ __forceinline__ void cp16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" :: "r"(smem_u32(dst)), "l"(src)
               : "memory");
}
__device__ __forceinline__ void gs_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void gs_wait(int n) {
  switch (n) {
    case 0: asm volatile("cp.async.wait_group 0;\n" ::: "memory"); break;
    case 1: asm volatile("cp.async.wait_group 1;\n" ::: "memory"); break;
    case 2: asm volatile("cp.async.wait_group 2;\n" ::: "memory"); break;
    case 3: asm volatile("cp.async.wait_group 3;\n" ::: "memory"); break;
    case 4: asm volatile("cp.async.wait_group 4;\n" ::: "memory"); break;
    case 5: asm volatile("cp.async.wait_group 5;\n" ::: "memory"); break;
    case 6: asm volatile("cp.async.wait_group 6;\n" ::: "memory"); break;
    default: asm volatile("cp.async.wait_group 7;\n" ::: "memory"); break;
  }
}

// The geometry of a block's stream. Stage i: group t = i / (NSEG * PPR) of this block (global
// group blockIdx.x + t * grid), segment seg, piece p; it reads n elements at segment offset e0.
struct GsGeom {
  int K, N, RG, PPR, NG, nseg;
  __device__ __forceinline__ int stages() const {
    int t = (NG - (int)blockIdx.x + (int)gridDim.x - 1) / (int)gridDim.x;
    return max(t, 0) * nseg * PPR;
  }
  __device__ __forceinline__ void stage(int i, int& seg, long long& e0, int& n) const {
    int per_group = nseg * PPR, t = i / per_group, rem = i - t * per_group;
    seg = rem / PPR;
    int p = rem - seg * PPR, row0 = ((int)blockIdx.x + t * (int)gridDim.x) * RG;
    e0 = (long long)row0 * K + (long long)p * STAGE_EL;
    n = PPR == 1 ? min(RG, N - row0) * K : min(STAGE_EL, K - p * STAGE_EL);
  }
  // this block's accumulator row of weight row `row` (of the block's own groups)
  __device__ __forceinline__ int local(int row) const {
    int g = row / RG;
    return (g - (int)blockIdx.x) / (int)gridDim.x * RG + (row - g * RG);
  }
};

template <typename T, int MT>
__device__ __forceinline__ void gs_flush(float* slots, float (&acc)[MT], const GsGeom& geo,
                                         int seg, int row, int slot_rows, int warp, int lane) {
  int lr = geo.local(row);
#pragma unroll
  for (int m = 0; m < MT; m++) {
    float s = warp_sum(acc[m]);
    if (lane == 0) slots[((seg * slot_rows + lr) * MT + m) * GS_WARPS + warp] = s;
    acc[m] = 0.f;
  }
}

template <typename T, int MT, bool PAIR, bool NORM>
__device__ void gemvs_impl(T* __restrict__ y, T* r_out, const T* x, const T* residual,
                           const T* nw, float eps, int zc, const T* __restrict__ w,
                           const T* __restrict__ bias, int M, int N, int K, int m0, int nst,
                           int slot_rows, int gelu) {
  extern __shared__ __align__(128) unsigned char gs_smem[];
  constexpr int NSEG = PAIR ? 2 : 1;
  T* stages = reinterpret_cast<T*>(gs_smem);
  T* xs = stages + (long long)nst * STAGE_EL;
  float* slots = reinterpret_cast<float*>(xs + MT * K);
  int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gpr = K >> 8;
  GsGeom geo;
  geo.K = K; geo.N = N; geo.nseg = NSEG;
  geo.RG = K <= STAGE_EL ? STAGE_EL / K : 1;
  geo.PPR = K <= STAGE_EL ? 1 : (K + STAGE_EL - 1) / STAGE_EL;
  geo.NG = (N + geo.RG - 1) / geo.RG;
  int total = geo.stages();
  auto issue = [&](int i) {  // every thread copies its 16-byte pieces of stage i, one group
    if (i < total) {
      int seg, n; long long e0;
      geo.stage(i, seg, e0, n);
      const T* src = w + (long long)seg * N * K + e0;
      T* dst = stages + (long long)(i % nst) * STAGE_EL;
      for (int e = tid * (16 / (int)sizeof(T)); e < n; e += blockDim.x * (16 / (int)sizeof(T)))
        cp16(dst + e, src + e);
    }
    gs_commit();
  };
  for (int i = 0; i < nst - 1; i++) issue(i);
  for (int i = tid; i < NSEG * slot_rows * MT * GS_WARPS; i += blockDim.x) slots[i] = 0.f;
  pdl_trigger();
  pdl_wait();
  if (NORM) {
    gemvn_norm_rows<T, MT>(xs, r_out, x, residual, nw, eps, zc, M, K, m0);
  } else {
    for (int i = tid * 8; i < MT * K; i += blockDim.x * 8)
      if (m0 + i / K < M) {
        Vec8<T> v; v.load(x + (long long)m0 * K + i); v.store(xs + i);
      }
    __syncthreads();
  }
  float acc[MT];
#pragma unroll
  for (int m = 0; m < MT; m++) acc[m] = 0.f;
  int cur_row = -1, cur_seg = 0;
  for (int i = 0; i < total; i++) {
    int seg, n; long long e0;
    geo.stage(i, seg, e0, n);
    gs_wait(nst - 2);
    __syncthreads();  // stage i landed for every thread; every warp is done with stage i - 1
    issue(i + nst - 1);
    if (seg != cur_seg) {
      if (cur_row >= 0) gs_flush<T, MT>(slots, acc, geo, cur_seg, cur_row, slot_rows, warp, lane);
      cur_row = -1;
      cur_seg = seg;
    }
    // this warp's granules of the stage: GPW consecutive ones, loaded before any math
    const T* st = stages + (long long)(i % nst) * STAGE_EL;
    int g0 = warp * GPW, ng = min(GPW, (n >> 8) - g0);
    if (ng > 0) {
      long long G = (e0 >> 8) + g0;
      int row = (int)(G / gpr), col = (int)(G - (long long)row * gpr);
      Vec8<T> wv[GPW], xv[GPW][MT];
#pragma unroll
      for (int j = 0; j < GPW; j++) {
        if (j < ng) {
          wv[j].load(st + (g0 + j) * 256 + lane * 8);
          int c = col + j;
          while (c >= gpr) c -= gpr;
          int k = c * 256 + lane * 8;
#pragma unroll
          for (int m = 0; m < MT; m++)
            if (m0 + m < M) xv[j][m].load(xs + m * K + k);
        }
      }
      float dot[GPW][MT];
#pragma unroll
      for (int j = 0; j < GPW; j++) {
        float wf[8];
        wv[j].to_float(wf);
#pragma unroll
        for (int m = 0; m < MT; m++) {
          float xf[8];
          xv[j][m].to_float(xf);
          float d0 = wf[0] * xf[0], d1 = wf[1] * xf[1];
#pragma unroll
          for (int q = 2; q < 8; q += 2) { d0 += wf[q] * xf[q]; d1 += wf[q + 1] * xf[q + 1]; }
          dot[j][m] = d0 + d1;
        }
      }
#pragma unroll
      for (int j = 0; j < GPW; j++) {
        if (j < ng) {
          if (row != cur_row) {
            if (cur_row >= 0)
              gs_flush<T, MT>(slots, acc, geo, cur_seg, cur_row, slot_rows, warp, lane);
            cur_row = row;
          }
#pragma unroll
          for (int m = 0; m < MT; m++) acc[m] += dot[j][m];
          if (++col == gpr) { col = 0; row++; }
        }
      }
    }
  }
  if (cur_row >= 0) gs_flush<T, MT>(slots, acc, geo, cur_seg, cur_row, slot_rows, warp, lane);
  __syncthreads();
  int lrows = total / (NSEG * geo.PPR) * geo.RG;
  for (int i = tid; i < lrows * MT; i += blockDim.x) {
    int lr = i / MT, m = i - lr * MT, t = lr / geo.RG;
    int n = ((int)blockIdx.x + t * (int)gridDim.x) * geo.RG + (lr - t * geo.RG);
    if (n >= N || m0 + m >= M) continue;
    float v = 0.f;
#pragma unroll
    for (int q = 0; q < GS_WARPS; q++) v += slots[(lr * MT + m) * GS_WARPS + q];
    v += bias ? to_f32(bias[n]) : 0.f;
    if (PAIR) {
      float u = 0.f;
#pragma unroll
      for (int q = 0; q < GS_WARPS; q++) u += slots[((slot_rows + lr) * MT + m) * GS_WARPS + q];
      u = to_f32(from_f32<T>(u + (bias ? to_f32(bias[N + n]) : 0.f)));
      v = gated_act(to_f32(from_f32<T>(v)), gelu) * u;
    }
    y[(long long)(m0 + m) * N + n] = from_f32<T>(v);
  }
}

#define GEMVS(T, S, MT)                                                                       \
  extern "C" __global__ void __launch_bounds__(256) gemvs_##S##_m##MT(                       \
      T* y, const T* x, const T* w, const T* bias, int M, int N, int K, int m0, int nst,      \
      int slot_rows) {                                                                        \
    gemvs_impl<T, MT, false, false>(y, nullptr, x, nullptr, nullptr, 0.f, 0, w, bias, M, N,  \
                                    K, m0, nst, slot_rows, 0);                                \
  }                                                                                           \
  extern "C" __global__ void __launch_bounds__(256) gemvs_norm_##S##_m##MT(                  \
      T* y, T* r, const T* x, const T* res, const T* nw, float eps, int zc, const T* w,       \
      const T* bias, int M, int N, int K, int m0, int nst, int slot_rows) {                   \
    gemvs_impl<T, MT, false, true>(y, r, x, res, nw, eps, zc, w, bias, M, N, K, m0, nst,     \
                                   slot_rows, 0);                                             \
  }                                                                                           \
  extern "C" __global__ void __launch_bounds__(256) gemvs_norm_act_##S##_m##MT(              \
      T* y, T* r, const T* x, const T* res, const T* nw, float eps, int zc, const T* w,       \
      const T* bias, int M, int N, int K, int m0, int nst, int slot_rows, int gelu) {         \
    gemvs_impl<T, MT, true, true>(y, r, x, res, nw, eps, zc, w, bias, M, N, K, m0, nst,      \
                                  slot_rows, gelu);                                           \
  }
#define GEMVSS(T, S) GEMVS(T, S, 1) GEMVS(T, S, 2) GEMVS(T, S, 4)
INSTANTIATE(GEMVSS)
