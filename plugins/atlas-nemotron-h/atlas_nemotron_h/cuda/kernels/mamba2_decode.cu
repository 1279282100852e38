// atlas-nemotron-h: the fused Mamba-2 decode step (reference: mamba2_decode in
// atlas_nemotron_h/mamba2_reference.py; the separate kernels it replaces are in mamba2.cu).
#include "common.cuh"
#include "cluster.cuh"
#include "mamba2_common.cuh"

// A whole decode step between in_proj and out_proj in one launch: the conv update (silu), the
// selective state update and the gated group norm of mamba2_decode, every intermediate rounded
// to T as the three separate kernels round it (the norm's sum of squares is summed in another
// order). Grid (H / hpb, num_seqs) in clusters of hpg / hpb blocks along x (hpg = H / G heads a
// group): a cluster is one SSM group of one sequence, whose blocks swap their sums of squares
// through distributed shared memory. Block M2D_WARPS warps over its hpb * P channels c (warp w:
// c = w, w + M2D_WARPS, ..., at most CPW), lane l state columns l, l + 32, ... (SPL a lane).
// Before griddepcontrol.wait (only what in_proj wrote waits): slot and length (host-written),
// the channels' state rows and conv windows (written by this layer's launch of an earlier step),
// conv weights, bias and norm weight. A thread convolves at most M2D_CONV of the block's
// hpb * P + 2 N channels (its x channels, then its group's B and C), kernel size at most
// M2D_KF. Block rank 0 of the cluster writes the group's B and C conv windows, after the
// cluster barrier that follows every member's reads of them.
#define M2D_WARPS 8
#define M2D_CONV 2
#define M2D_KF 4
template <typename T, typename W, int CPW, int SPL>
__device__ void m2_decode_impl(T* out, const T* xbc, const T* z, const T* dt, const T* cw,
                               const T* cb, const float* a_log, const float* dt_bias,
                               const float* d_skip, const W* nw, float* conv_states,
                               float* ssm_states, const int* seq_lens, const int* state_indices,
                               int H, int P, int G, int N, int k, int hpb, float dt_min,
                               float dt_max, float eps) {
  extern __shared__ float m2d_conv[];  // conv outputs: x channels (C), B (N), C (N)
  __shared__ float red[M2D_WARPS], parts[8];
  int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, b = blockIdx.y;
  int h0 = blockIdx.x * hpb, C = hpb * P, hpg = H / G, g = h0 / hpg;
  int dim = H * P + 2 * G * N, nconv = C + 2 * N;
  long long inner = (long long)H * P;
  cluster_arrive(true);  // #1
  pdl_trigger();
  int slot = state_indices[b];
  bool has = slot >= 0 && seq_lens[b] > 1;
  long long sl = slot < 0 ? 0 : slot;
  // every load of the block is issued before any result is used: a channel's parameters and,
  // after the wait, its dt and gate too (loads inside the scan loop would each be a round trip)
  float s[CPW][SPL], wn[CPW], na[CPW], dtb[CPW], dsk[CPW];
#pragma unroll
  for (int i = 0; i < CPW; i++) {
    int c = warp + M2D_WARPS * i, h = h0 + min(c, C - 1) / P;
    const float* st = ssm_states + (sl * H * P + (long long)h0 * P + c) * N;
#pragma unroll
    for (int j = 0; j < SPL; j++)
      s[i][j] = (has && c < C && j * 32 + lane < N) ? st[j * 32 + lane] : 0.f;
    wn[i] = c < C ? to_f32(nw[(long long)h0 * P + c]) : 0.f;
    na[i] = a_log[h];
    dtb[i] = dt_bias[h];
    dsk[i] = d_skip[h];
  }
  int chan[M2D_CONV];
  float win[M2D_CONV][M2D_KF], wf[M2D_CONV][M2D_KF], bf[M2D_CONV];
#pragma unroll
  for (int q = 0; q < M2D_CONV; q++) {
    int v = tid + q * M2D_WARPS * 32;
    chan[q] = v < C ? h0 * P + v
                    : v < C + N ? H * P + g * N + (v - C) : H * P + G * N + g * N + (v - C - N);
    bool live = v < nconv;
    const float* cs = conv_states + sl * (k - 1) * dim + chan[q];
#pragma unroll
    for (int i = 0; i < M2D_KF; i++) {
      win[q][i] = (live && has && i < k - 1) ? cs[(long long)i * dim] : 0.f;
      wf[q][i] = (live && i < k) ? to_f32(cw[(long long)chan[q] * k + i]) : 0.f;
    }
    bf[q] = live && cb ? to_f32(cb[chan[q]]) : 0.f;
  }
  pdl_wait();
  const T* row = xbc + (long long)b * dim;
  float dtv[CPW], zv[CPW], xin[M2D_CONV];
#pragma unroll
  for (int i = 0; i < CPW; i++) {
    int c = min(warp + M2D_WARPS * i, C - 1);
    dtv[i] = to_f32(dt[(long long)b * H + h0 + c / P]);
    zv[i] = to_f32(z[(long long)b * inner + (long long)h0 * P + c]);
  }
#pragma unroll
  for (int q = 0; q < M2D_CONV; q++)
    xin[q] = tid + q * M2D_WARPS * 32 < nconv ? to_f32(row[chan[q]]) : 0.f;
#pragma unroll
  for (int q = 0; q < M2D_CONV; q++) {
    int v = tid + q * M2D_WARPS * 32;
    if (v >= nconv) break;
    float xn = xin[q], acc = 0.f;
#pragma unroll
    for (int i = 0; i < M2D_KF; i++) {
      if (i == k - 1) win[q][i] = xn;
      if (i < k) acc += win[q][i] * wf[q][i];
    }
    acc += bf[q];
    m2d_conv[v] = to_f32(from_f32<T>(m2_silu(acc)));
  }
  __syncthreads();
  const float* bs = m2d_conv + C;
  const float* csm = m2d_conv + C + N;
  float hg[CPW], sq = 0.f;
#pragma unroll
  for (int i = 0; i < CPW; i++) {
    int c = warp + M2D_WARPS * i;
    hg[i] = 0.f;
    if (c < C) {
      float step = m2_softplus(dtv[i] + dtb[i]);
      step = fminf(fmaxf(step, dt_min), dt_max);
      float decay = expf(step * -expf(na[i])), xv = m2d_conv[c], acc = 0.f;
#pragma unroll
      for (int j = 0; j < SPL; j++) {
        int col = j * 32 + lane;
        if (col < N) {
          s[i][j] = s[i][j] * decay + (step * bs[col]) * xv;
          acc += s[i][j] * csm[col];
        }
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
      float y = to_f32(from_f32<T>(acc + dsk[i] * xv));
      hg[i] = y * m2_silu(zv[i]);
      sq += hg[i] * hg[i];
    }
  }
  if (lane == 0) red[warp] = sq;
  __syncthreads();
  float part = 0.f;
  for (int w = 0; w < M2D_WARPS; w++) part += red[w];
  u32 rank, csize;
  cluster_rank(rank, csize);
  cluster_wait();  // #1: every member has started
  if (tid < (int)csize) cluster_store_f32(&parts[rank], tid, part);
  cluster_arrive(false);  // #2: this block's sum is in every member
  cluster_wait();
  float total = 0.f;
  for (u32 r = 0; r < csize; r++) total += parts[r];
  float inv = rsqrtf(total / (float)(hpg * P) + eps);
  if (lane == 0)
#pragma unroll
    for (int i = 0; i < CPW; i++) {
      int c = warp + M2D_WARPS * i;
      if (c < C) {
        float normed = to_f32(from_f32<T>(hg[i] * inv));
        out[(long long)b * inner + (long long)h0 * P + c] = from_f32<T>(normed * wn[i]);
      }
    }
  if (slot < 0) return;
#pragma unroll
  for (int i = 0; i < CPW; i++) {
    int c = warp + M2D_WARPS * i;
    float* st = ssm_states + (sl * H * P + (long long)h0 * P + c) * N;
#pragma unroll
    for (int j = 0; j < SPL; j++)
      if (c < C && j * 32 + lane < N) st[j * 32 + lane] = s[i][j];
  }
#pragma unroll
  for (int q = 0; q < M2D_CONV; q++) {
    int v = tid + q * M2D_WARPS * 32;
    if (v >= nconv || (v >= C && rank != 0)) continue;
    float* cs = conv_states + sl * (k - 1) * dim + chan[q];
#pragma unroll
    for (int i = 0; i < M2D_KF - 1; i++)
      if (i < k - 1) cs[(long long)i * dim] = win[q][i + 1];
  }
}

// mamba2_decode_[wf32_]c{CPW}s{SPL}_S: the norm weight in T or float32; the 8 x 4 builds keep
// to 128 registers, so two blocks share an SM
#define MAMBA2_DECODE(T, S, WN, W, CPW, SPL, MINB)                                            \
  extern "C" __global__ void __launch_bounds__(M2D_WARPS * 32, MINB)                          \
      mamba2_decode_##WN##c##CPW##s##SPL##_##S(                                               \
          T* out, const T* xbc, const T* z, const T* dt, const T* cw, const T* cb,            \
          const float* a_log, const float* dt_bias, const float* d, const W* nw, float* cst,   \
          float* sst, const int* lens, const int* idx, int H, int P, int G, int N, int k,      \
          int hpb, float dt_min, float dt_max, float eps) {                                   \
    m2_decode_impl<T, W, CPW, SPL>(out, xbc, z, dt, cw, cb, a_log, dt_bias, d, nw, cst, sst,  \
                                   lens, idx, H, P, G, N, k, hpb, dt_min, dt_max, eps);       \
  }
#define MAMBA2_DECODE_KERNELS(T, S)                                                           \
  MAMBA2_DECODE(T, S, , T, 8, 4, 2) MAMBA2_DECODE(T, S, , T, 8, 8, 1)                        \
  MAMBA2_DECODE(T, S, , T, 16, 4, 1) MAMBA2_DECODE(T, S, wf32_, float, 8, 4, 2)               \
  MAMBA2_DECODE(T, S, wf32_, float, 8, 8, 1) MAMBA2_DECODE(T, S, wf32_, float, 16, 4, 1)
INSTANTIATE(MAMBA2_DECODE_KERNELS)
