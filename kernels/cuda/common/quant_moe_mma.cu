// Decode MoE experts with quantized stacks on the tensor cores (W8A16 / W4A16; moe_experts for
// at most 8 tokens, bf16 / f16 x, both K a multiple of 128):
//   qmoe2_gate_up_{fp8,nvfp4}_*_d{D}  h[p, n] = act(gate_e(x[tok]))[n] * up_e(x[tok])[n] in T
//                                     for every (token, slot) pair p = tok * k + j, e = ids[p];
//                                     grid (ceil(I / 16 * S / 8), pairs), 8 warps a block.
//   qmoe2_down_{fp8,nvfp4}_*_d{D}     out[tok, n] = sum_j weights[tok, j] * down_e(h[p])[n];
//                                     grid (ceil(H / 16 * S / 8), tokens).
// Why: quant_moe.cu spends a warp per weight row and converts every code to f32 on the CUDA
// cores, which bounds it far below the memory floor. Here, as in quant_skinny.cu, the weight is
// the mma.sync m16n8k16 A operand (16 rows a warp) decoded with integer ops (quant_common.cuh)
// and the activation row the B operand (column 0 of the n-tile; the other 7 are zero: MMA
// throughput is not what bounds a decode step). A gate_up warp holds two A tiles, gate rows
// n0.. and the matching up rows I + n0.., which share the x fragments, so the epilogue writes
// act(gate) * up itself. A down warp loops over work units (slot j, 128-wide K step s), each
// slot its own expert's tile and h row, and accumulates weights[p] * (its MMA result).
// The S warps of a tile (host: quant_moe.qmoe_splits) split the K steps (units) and sum in
// shared memory; each lane keeps D steps of weight loads in flight in a register ring. Only the
// chosen experts' bytes are read, each once a pair (gate_up) or once a token (down).
// FP8 scales (tensor, channel, block with bk a multiple of 128; the expert's block at e * s_lead)
// multiply each step's MMA result per row; NVFP4 group scales go into the decode and the
// expert's global scale times QPair::fp4_out() into the per-unit factor.
// The expert ids come from the router kernel before, so nothing loads before the PDL wait.
// A pair of weight exactly 0 (expert parallelism: another rank's expert, id 0) reads nothing:
// its gate_up blocks return at once (h row unwritten) and the down kernel's units run over the
// token's other slots only (with no weight 0, the same units as before: bit-identical sums).
#include "common.cuh"
#include "mma.cuh"
#include "quant_common.cuh"

// One work unit's loads for a lane, MT tiles of two rows each: the codes, the scale words
// (FP8 sc[m][r]: the f32 scale of row r's block at this step, as bits; NVFP4 sc[m][0]: the two
// e4m3 group scales of row 0 in bits 0-15, of row 1 in 16-31) and the unit's factor f. All
// are issued D units ahead, so a unit's scales cost no second memory round trip after its
// codes arrive (with two units a warp, a step's scale load was a third dependent latency).
template <int MT, int V> struct QmoeSlot {
  uint4 w[MT][2][V];
  u32 sc[MT][V];
  float f;
};

// Issue tile m of a slot: the lane's codes of rows rows[0..1] of one expert matrix (`w` its
// first row, `scale` its scales, K wide) at step s, and their scale words.
template <int FMT, int MT, int V>
__device__ __forceinline__ void qmoe_issue(QmoeSlot<MT, V>& slot, int m,
                                           const unsigned char* w, const void* scale,
                                           const QScale& q, const int (&rows)[2], int K, int s,
                                           int t) {
  long long row_bytes = FMT == 0 ? K : K / 2;
#pragma unroll
  for (int r = 0; r < 2; r++) {
    const unsigned char* p =
        w + rows[r] * row_bytes + (long long)s * 64 * V + qchunk_offset(t, 0);
#pragma unroll
    for (int v = 0; v < V; v++) slot.w[m][r][v] = ld_stream(p + 64 * v);
    if constexpr (FMT == 0) {
      slot.sc[m][r] = __float_as_uint(reinterpret_cast<const float*>(
          scale)[(rows[r] / q.bn) * q.s_row + (s * 128) / q.bk]);
    } else {
      u32 gs = *reinterpret_cast<const unsigned short*>(
          reinterpret_cast<const unsigned char*>(scale) + (long long)rows[r] * (K / 16) +
          (s * 128 + 32 * t) / 16);
      slot.sc[m][0] = r ? slot.sc[m][0] | (gs << 16) : gs;
    }
  }
}

// Decode tile m of a slot, multiply it with the B fragments b and add f times row r's
// column-0 result into acc[r] (lanes t == 0 hold column 0; FP8: times the row's scale too).
template <typename T, int FMT, int MT, int V>
__device__ __forceinline__ void qmoe_tile_step(float (&acc)[2], const QmoeSlot<MT, V>& slot,
                                               int m, const u32 (&b)[8][2]) {
  u32 a[8][4];
  float fr[2] = {slot.f, slot.f};
  if constexpr (FMT == 0) {
#pragma unroll
    for (int r = 0; r < 2; r++) fr[r] *= __uint_as_float(slot.sc[m][r]);
    qdecode_fp8<T>(slot.w[m], a);
  } else {
    const u32 sc[2] = {slot.sc[m][0] & 0xffffu, slot.sc[m][0] >> 16};
    qdecode_nvfp4<T>(slot.w[m], sc, a);
  }
  float c[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int st = 0; st < 8; st++) mma16816<T>(c, a[st], b[st]);
  acc[0] += fr[0] * c[0];
  acc[1] += fr[1] * c[2];
}

// The B fragments of one K step from activation row `xr` (K wide): only lanes g == 0 load (the
// n-tile's column 0), the rest hold zeros.
template <typename T, int FMT>
__device__ __forceinline__ void qmoe_b_frags(u32 (&b)[8][2], const T* xr, int K, int k0, int g,
                                             int t) {
  uint4 xv[4];
  qx_load<T, FMT>(xv, xr, g, 1, K, k0, t);
#pragma unroll
  for (int st = 0; st < 8; st++) qx_frag<FMT>(xv, st, b[st]);
}

// Sum the NV accumulators of the S warps of a tile (warps part 0..S-1 adjacent) into part 0's;
// every warp of the block must call it. Returns whether this warp holds the sum.
template <int NV>
__device__ __forceinline__ bool qmoe_reduce(float (&acc)[NV], int S, int warp, int part,
                                            int lane) {
  if (S == 1) return true;
  __shared__ float red[8][NV][32];
#pragma unroll
  for (int i = 0; i < NV; i++) red[warp][i][lane] = acc[i];
  __syncthreads();
  if (part) return false;
  for (int p = 1; p < S; p++)
#pragma unroll
    for (int i = 0; i < NV; i++) acc[i] += red[warp + p][i][lane];
  return true;
}

// Expert e's scales in a stack of `rows`-row, K-wide matrices.
template <int FMT>
__device__ __forceinline__ const void* qmoe_expert_scale(const QScale& q, int e, int rows, int K,
                                                         long long s_lead) {
  if (FMT == 0) return reinterpret_cast<const float*>(q.scale) + e * s_lead;
  return reinterpret_cast<const unsigned char*>(q.scale) + (long long)e * rows * (K / 16);
}

template <typename T, int FMT, int D>
__device__ void qmoe2_gate_up_impl(T* __restrict__ h, const T* __restrict__ x,
                                   const unsigned char* __restrict__ w, QScale q, long long s_lead,
                                   const float* __restrict__ weights,
                                   const int* __restrict__ ids, int k, int H, int I, int gelu,
                                   int S) {
  using P = QPair<T>;
  constexpr int V = FMT == 0 ? 2 : 1;  // 16-byte loads of one row a step
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, t = lane & 3, g = lane >> 2;
  int part = warp % S, n0 = (blockIdx.x * (8 / S) + warp / S) * 16, p = blockIdx.y;
  pdl_trigger();
  pdl_wait();
  int e = ids[p];
  if (weights[p] == 0.f) return;  // the whole block (p is blockIdx.y): no qmoe_reduce barrier
  const unsigned char* we = w + (long long)e * 2 * I * (FMT == 0 ? H : H / 2);
  const void* se = qmoe_expert_scale<FMT>(q, e, 2 * I, H, s_lead);
  int rows[2][2];  // gate rows n0 + g (+ 8), up rows I + the same
#pragma unroll
  for (int m = 0; m < 2; m++)
#pragma unroll
    for (int r = 0; r < 2; r++) rows[m][r] = m * I + min(n0 + g + 8 * r, I - 1);
  auto issue = [&](QmoeSlot<2, V>& slot, int s) {
#pragma unroll
    for (int m = 0; m < 2; m++) qmoe_issue<FMT, 2, V>(slot, m, we, se, q, rows[m], H, s, t);
    slot.f = 1.f;
  };
  int steps = n0 < I ? H / 128 : 0;
  QmoeSlot<2, V> ring[D + 1];
#pragma unroll
  for (int u = 0; u < D; u++)
    if (part + u * S < steps) issue(ring[u], part + u * S);
  const T* xr = x + (long long)(p / k) * H;
  float acc[2][2] = {{0.f, 0.f}, {0.f, 0.f}};
  for (int s = part; s < steps;) {
#pragma unroll
    for (int u = 0; u <= D; u++) {
      if (s < steps) {
        if (s + D * S < steps) issue(ring[(u + D) % (D + 1)], s + D * S);
        u32 b[8][2];
        qmoe_b_frags<T, FMT>(b, xr, H, s * 128, g, t);
#pragma unroll
        for (int m = 0; m < 2; m++) qmoe_tile_step<T, FMT, 2, V>(acc[m], ring[u], m, b);
        s += S;
      }
    }
  }
  float sum[4] = {acc[0][0], acc[0][1], acc[1][0], acc[1][1]};
  if (!qmoe_reduce<4>(sum, S, warp, part, lane) || n0 >= I || t) return;
  float out = FMT == 1 ? q.gscale[e] * P::fp4_out() : 1.f;
#pragma unroll
  for (int r = 0; r < 2; r++) {
    int n = n0 + g + 8 * r;
    if (n < I)
      h[(long long)p * I + n] = from_f32<T>(gated_act(sum[r] * out, gelu) * (sum[2 + r] * out));
  }
}

template <typename T, int FMT, int D>
__device__ void qmoe2_down_impl(T* __restrict__ y, const T* __restrict__ h,
                                const unsigned char* __restrict__ w, QScale q, long long s_lead,
                                const float* __restrict__ weights, const int* __restrict__ ids,
                                int k, int H, int I, int S) {
  using P = QPair<T>;
  constexpr int V = FMT == 0 ? 2 : 1;
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, t = lane & 3, g = lane >> 2;
  int part = warp % S, n0 = (blockIdx.x * (8 / S) + warp / S) * 16, tok = blockIdx.y;
  pdl_trigger();
  pdl_wait();
  int rows[2];
#pragma unroll
  for (int r = 0; r < 2; r++) rows[r] = min(n0 + g + 8 * r, H - 1);
  // The token's slots of non-zero weight, in order (k <= 32: the host sends larger top-k to
  // quant_moe.cu), listed once a block (its warps share the token) in shared memory: the units
  // run over those only, so a slot of weight 0 costs no load and no unit. With every weight
  // non-zero, entry r is slot r: the same units on the same warps as before. (Shared memory,
  // not a register a lane: FP8 depth 4 has none to spare below 128.)
  __shared__ int s_slot[32], s_live;
  if (warp == 0) {
    bool nz = lane < k && weights[tok * k + lane] != 0.f;
    u32 live = __ballot_sync(0xffffffffu, nz);
    if (nz) s_slot[__popc(live & ((1u << lane) - 1u))] = lane;
    if (lane == 0) s_live = __popc(live);
  }
  __syncthreads();
  int steps = I / 128, units = n0 < H ? s_live * steps : 0;
  // unit u: live slot u / steps, step u % steps
  auto issue = [&](QmoeSlot<1, V>& slot, int u) {
    int r = u / steps, s = u - r * steps, pj = tok * k + s_slot[r], e = ids[pj];
    qmoe_issue<FMT, 1, V>(slot, 0, w + (long long)e * H * (FMT == 0 ? I : I / 2),
                          qmoe_expert_scale<FMT>(q, e, H, I, s_lead), q, rows, I, s, t);
    slot.f = weights[pj] * (FMT == 1 ? q.gscale[e] * P::fp4_out() : 1.f);
  };
  QmoeSlot<1, V> ring[D + 1];
#pragma unroll
  for (int u = 0; u < D; u++)
    if (part + u * S < units) issue(ring[u], part + u * S);
  float acc[2] = {0.f, 0.f};
  for (int i = part; i < units;) {
#pragma unroll
    for (int u = 0; u <= D; u++) {
      if (i < units) {
        if (i + D * S < units) issue(ring[(u + D) % (D + 1)], i + D * S);
        int r = i / steps, s = i - r * steps, j = s_slot[r];
        u32 b[8][2];
        qmoe_b_frags<T, FMT>(b, h + (long long)(tok * k + j) * I, I, s * 128, g, t);
        qmoe_tile_step<T, FMT, 1, V>(acc, ring[u], 0, b);
        i += S;
      }
    }
  }
  if (!qmoe_reduce<2>(acc, S, warp, part, lane) || n0 >= H || t) return;
#pragma unroll
  for (int r = 0; r < 2; r++) {
    int n = n0 + g + 8 * r;
    if (n < H) y[(long long)tok * H + n] = from_f32<T>(acc[r]);
  }
}

#define QMOE2_GATE_UP(T, S, D)                                                                \
  extern "C" __global__ void __launch_bounds__(256) qmoe2_gate_up_fp8_##S##_d##D(            \
      T* h, const T* x, const unsigned char* w, const float* scale, const float* weights,     \
      const int* ids, int k, int H, int I, int gelu, int s, int bn, int bk, int s_row,        \
      long long s_lead) {                                                                     \
    qmoe2_gate_up_impl<T, 0, D>(h, x, w, QScale{scale, nullptr, bn, bk, s_row}, s_lead,      \
                                weights, ids, k, H, I, gelu, s);                              \
  }                                                                                           \
  extern "C" __global__ void __launch_bounds__(256, 2) qmoe2_gate_up_nvfp4_##S##_d##D(       \
      T* h, const T* x, const unsigned char* w, const unsigned char* scale,                   \
      const float* gscale, const float* weights, const int* ids, int k, int H, int I,         \
      int gelu, int s) {                                                                      \
    qmoe2_gate_up_impl<T, 1, D>(h, x, w, QScale{scale, gscale, 1, 16, 0}, 0, weights, ids, k, \
                                H, I, gelu, s);                                               \
  }
#define QMOE2_DOWN(T, S, D)                                                                   \
  extern "C" __global__ void __launch_bounds__(256) qmoe2_down_fp8_##S##_d##D(               \
      T* y, const T* h, const unsigned char* w, const float* scale, const float* weights,     \
      const int* ids, int k, int H, int I, int s, int bn, int bk, int s_row,                  \
      long long s_lead) {                                                                     \
    qmoe2_down_impl<T, 0, D>(y, h, w, QScale{scale, nullptr, bn, bk, s_row}, s_lead, weights, \
                             ids, k, H, I, s);                                                \
  }                                                                                           \
  extern "C" __global__ void __launch_bounds__(256) qmoe2_down_nvfp4_##S##_d##D(             \
      T* y, const T* h, const unsigned char* w, const unsigned char* scale,                   \
      const float* gscale, const float* weights, const int* ids, int k, int H, int I,         \
      int s) {                                                                                \
    qmoe2_down_impl<T, 1, D>(y, h, w, QScale{scale, gscale, 1, 16, 0}, 0, weights, ids, k,   \
                             H, I, s);                                                        \
  }
// The depths quant_moe.QMOE2_DEPTH may pick. gate_up holds four weight rows a lane: depth 2 is
// 167-170 registers with FP8 (one block a SM) and fits 128 with NVFP4 (two blocks a SM; the
// NVFP4 kernel asks for that in its launch bounds, and depth 4 would spill there); depth 1
// stays for A/B runs. down holds two rows: depth 4 is 97-128 registers.
#define QMOE2_ALL(T, S)                                                                       \
  QMOE2_GATE_UP(T, S, 1) QMOE2_GATE_UP(T, S, 2) QMOE2_DOWN(T, S, 2) QMOE2_DOWN(T, S, 4)
#if ATLAS_MMA
INSTANTIATE(QMOE2_ALL)
#endif
