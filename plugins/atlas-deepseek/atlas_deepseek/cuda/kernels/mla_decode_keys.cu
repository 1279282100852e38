// atlas-deepseek: absorbed MLA decode attention on tensor cores with the warps splitting the
// KEYS of a tile (mma.sync m16n8k16, sm_80+), for latents whose 16-head x RANK accumulator
// fits a warp's registers (Mistral-Small-4, 256 + 64, 32 heads). mla_decode_keys2.cu (warp
// pairs split the output columns too: twice the warps an SM) replaced it as the default; it
// stays as an A/B baseline (ATLAS_MLA_DECODE=keys1), as does mla_decode_mma.cu (the warps
// split the row width; v1). All write the same partials for mla_decode_combine.
//
// Why a second kernel: Mistral-Small-4 does ~58 FLOP per latent byte, so it is bound by the
// latent read, but mla_decode_mma splits each S product over the row width: every warp
// exchanges partial scores through shared memory (one more barrier a tile) and all NW warps
// redo the same online softmax, ~1000 instructions a warp per 64-key tile at one block per SM,
// too slow to keep the HBM stream busy. Here warp (mh, kw) of MH x KW owns heads mh*16.. and
// keys kw*16.. of every BN = 16 * KW key tile, as the dense GQA decode kernel does
// (attention_decode_mma.cu): the full-width S = Q . C^T of its 16 x 16 block (Q by ldmatrix
// from shared memory: it does not fit registers beside O), its own online softmax (exp2
// domain), O += P . C[:, :RANK] over all RANK columns in registers (RANK / 8 n8 tiles: 128
// floats a thread at 256). No score exchange: one barrier a tile, for the cp.async ring.
// After the last tile the KW key-warps of a head tile merge (m, l, O) once, through the
// shared memory the ring and queries used.
//
// Grid (sequence, head group of HT = 16 * MH heads, context split); splits own whole tiles.
// Keys past the split's end are zero-filled by cp.async and masked to -inf; heads past `heads`
// are zero queries whose rows are never written (a warp whose 16 heads all lie past it skips
// the math). A split with no keys writes max -inf, sum 0 and zero rows.
#include "common.cuh"
#include "mma.cuh"
#if ATLAS_MMA

template <typename T, int RANK, int ROPE, int MH, int KW>
__device__ void mla_decode_keys_impl(float* part_o, float* part_ml, const T* q_lat,
                                     const T* q_pe, const T* cache, const int* tables,
                                     const int* seq_lens, int heads, int max_blocks,
                                     int block_size, float scale_log2, int splits, int stages) {
  constexpr int W = RANK + ROPE, LD = W + 8;  // row width; padded smem row (no conflicts)
  constexpr int HT = 16 * MH, BN = 16 * KW, THREADS = 32 * MH * KW;
  constexpr int KS = W / 16, ND = RANK / 8, CH = W / 8;  // S k-steps; O n8 tiles; 16 B chunks
  constexpr int MLD = RANK + 8;  // merge row stride in floats: conflict-free float2 stores
  static_assert(W % 16 == 0 && RANK % 16 == 0, "whole k-steps of S, n8 pairs of O");
  extern __shared__ __align__(16) unsigned char mla_keys_smem[];
  T* sq = reinterpret_cast<T*>(mla_keys_smem);             // [HT][LD]
  T* skv = sq + HT * LD;                                   // [stages][BN][LD]
  float* sacc = reinterpret_cast<float*>(mla_keys_smem);   // after the loop: [KW][HT][MLD]
  __shared__ float sm_m[KW][HT], sm_l[KW][HT], sm_w[KW][HT];

  int b = blockIdx.x, h0 = blockIdx.y * HT, split = blockIdx.z;
  int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, mh = warp % MH, kw = warp / MH;
  int len = seq_lens[b];
  int chunk = ((len + splits - 1) / splits + BN - 1) / BN * BN;
  int k0 = min(len, split * chunk), k1 = min(len, k0 + chunk);
  int ntiles = (k1 - k0 + BN - 1) / BN;
  const int* table = tables + (long long)b * max_blocks;
  // Power-of-two pages (16, 64: all in practice) gather by shifts, not divisions.
  int bshift = (block_size & (block_size - 1)) == 0 ? __ffs(block_size) - 1 : -1;

  for (int c = tid; c < HT * CH; c += THREADS) {
    int r = c / CH, col = (c % CH) * 8, h = h0 + r;
    bool ok = h < heads;
    long long row = (long long)b * heads + (ok ? h : 0);
    const T* src = col < RANK ? q_lat + row * RANK + col : q_pe + row * ROPE + (col - RANK);
    cp_async16(sq + r * LD + col, src, ok);
  }
  auto load_tile = [&](int stage, int t0) {
    T* dst = skv + stage * BN * LD;
    for (int c = tid; c < BN * CH; c += THREADS) {
      int r = c / CH, col = (c % CH) * 8, j = t0 + r;
      bool ok = j < k1;
      int blk = bshift >= 0 ? j >> bshift : j / block_size;
      int off = bshift >= 0 ? j & (block_size - 1) : j % block_size;
      long long row = ok ? (long long)__ldg(table + blk) * block_size + off : 0;
      cp_async16(dst + r * LD + col, cache + row * W + col, ok);
    }
  };
  // Group g holds tile g (group 0 also the queries).
  for (int s = 0; s < stages - 1; s++) {
    if (s < ntiles) load_tile(s, k0 + s * BN);
    asm volatile("cp.async.commit_group;\n");
  }

  float o[ND][4], m[2] = {NEG_INF, NEG_INF}, l[2] = {0.f, 0.f};
#pragma unroll
  for (int n = 0; n < ND; n++)
#pragma unroll
    for (int e = 0; e < 4; e++) o[n][e] = 0.f;
  const int kb = kw * 16, mi = lane >> 3;
  const bool active = h0 + mh * 16 < heads;  // warp-uniform
  const T* qrow = sq + (mh * 16 + (lane & 15)) * LD + (lane >> 4) * 8;

  for (int it = 0; it < ntiles; it++) {
    // Tile `it` landed: stages - 1 + it groups committed, stages - 2 may stay in flight.
    if (stages >= 4) asm volatile("cp.async.wait_group 2;\n");
    else if (stages == 3) asm volatile("cp.async.wait_group 1;\n");
    else asm volatile("cp.async.wait_group 0;\n");
    __syncthreads();  // every copy visible; every warp done with tile it - 1's buffer
    int nx = it + stages - 1;
    if (nx < ntiles) load_tile(nx % stages, k0 + nx * BN);
    asm volatile("cp.async.commit_group;\n");
    int j0 = k0 + it * BN + kb;  // this warp's first key
    if (!active || j0 >= k1) continue;  // warp-uniform: no heads or no keys of its own
    const T* tile = skv + (it % stages) * BN * LD;

    // S = Q . C^T for 16 heads x 16 keys; even / odd k-steps in separate accumulators so
    // four mma chains, not two, hide the tensor-core latency.
    float sa[2][2][4];
#pragma unroll
    for (int p = 0; p < 2; p++)
#pragma unroll
      for (int n = 0; n < 2; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) sa[p][n][e] = 0.f;
    const T* krow = tile + (kb + (mi >> 1) * 8 + (lane & 7)) * LD + (mi & 1) * 8;
#pragma unroll
    for (int kk = 0; kk < KS; kk++) {
      u32 a[4], t[4];
      ldmatrix_x4(a, qrow + kk * 16);
      ldmatrix_x4(t, krow + kk * 16);
      u32 b0[2] = {t[0], t[1]}, b1[2] = {t[2], t[3]};
      mma16816<T>(sa[kk & 1][0], a, b0);
      mma16816<T>(sa[kk & 1][1], a, b1);
    }
    float s[2][4], mx[2] = {m[0], m[1]};
#pragma unroll
    for (int n = 0; n < 2; n++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        int j = j0 + n * 8 + (lane & 3) * 2 + (e & 1);
        float v = j < k1 ? (sa[0][n][e] + sa[1][n][e]) * scale_log2 : NEG_INF;
        s[n][e] = v;
        mx[e >> 1] = fmaxf(mx[e >> 1], v);
      }
    float corr[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      corr[r] = mx[r] == NEG_INF ? 1.f : exp2f(m[r] - mx[r]);
      m[r] = mx[r];
      l[r] *= corr[r];
    }
    // Once the running max settles (most tiles of a long context) skip the 128-float rescale.
    if (__any_sync(0xffffffffu, corr[0] != 1.f || corr[1] != 1.f)) {
#pragma unroll
      for (int n = 0; n < ND; n++) {
        o[n][0] *= corr[0]; o[n][1] *= corr[0]; o[n][2] *= corr[1]; o[n][3] *= corr[1];
      }
    }
#pragma unroll
    for (int n = 0; n < 2; n++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        float p = m[e >> 1] == NEG_INF ? 0.f : exp2f(s[n][e] - m[e >> 1]);
        s[n][e] = p;
        l[e >> 1] += p;
      }
    u32 pa[4] = {pack2<T>(s[0][0], s[0][1]), pack2<T>(s[0][2], s[0][3]),
                 pack2<T>(s[1][0], s[1][1]), pack2<T>(s[1][2], s[1][3])};
    const T* vrow = tile + (kb + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + (lane >> 4) * 8;
#pragma unroll
    for (int n = 0; n < ND; n += 2) {
      u32 vf[4];
      ldmatrix_x4_trans(vf, vrow + n * 8);
      u32 b0[2] = {vf[0], vf[1]}, b1[2] = {vf[2], vf[3]};
      mma16816<T>(o[n], pa, b0);
      mma16816<T>(o[n + 1], pa, b1);
    }
  }
  asm volatile("cp.async.wait_group 0;\n");
  __syncthreads();  // every warp is done with q and the ring: they become the merge buffer

#pragma unroll
  for (int r = 0; r < 2; r++) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
  if (active) {
    int row = mh * 16 + (lane >> 2);
    float* mine = sacc + (kw * HT + row) * MLD + (lane & 3) * 2;
#pragma unroll
    for (int r = 0; r < 2; r++)
#pragma unroll
      for (int n = 0; n < ND; n++)
        *reinterpret_cast<float2*>(mine + r * 8 * MLD + n * 8) =
            make_float2(o[n][2 * r], o[n][2 * r + 1]);
    if ((lane & 3) == 0) {
#pragma unroll
      for (int r = 0; r < 2; r++) {
        sm_m[kw][row + 8 * r] = m[r];
        sm_l[kw][row + 8 * r] = l[r];
      }
    }
  }
  __syncthreads();
  long long base = ((long long)b * splits + split) * heads + h0;  // row of head h0
  if (tid < HT && h0 + tid < heads) {
    float mt = NEG_INF, lt = 0.f;
#pragma unroll
    for (int k = 0; k < KW; k++) mt = fmaxf(mt, sm_m[k][tid]);
#pragma unroll
    for (int k = 0; k < KW; k++) {
      float w = sm_m[k][tid] == NEG_INF ? 0.f : exp2f(sm_m[k][tid] - mt);
      sm_w[k][tid] = w;
      lt += w * sm_l[k][tid];
    }
    part_ml[2 * (base + tid)] = mt * 0.6931471805599453f;  // log2 -> natural (-inf stays)
    part_ml[2 * (base + tid) + 1] = lt;
  }
  __syncthreads();
  for (int i = tid; i < HT * (RANK / 4); i += THREADS) {
    int r = i / (RANK / 4), c = (i % (RANK / 4)) * 4;
    if (h0 + r >= heads) break;  // rows only grow with i
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int k = 0; k < KW; k++) {
      float w = sm_w[k][r];
      float4 v = *reinterpret_cast<const float4*>(sacc + (k * HT + r) * MLD + c);
      acc.x += w * v.x; acc.y += w * v.y; acc.z += w * v.z; acc.w += w * v.w;
    }
    *reinterpret_cast<float4*>(part_o + (base + r) * RANK + c) = acc;
  }
}

// One kernel per latent shape, named mla_decode_keys_r<RANK>_<dtype>; the launch parameters
// (heads per block 16 * MH, MH * KW warps, 16 * KW keys a tile) are KEYS_DECODE_CONFIGS in
// atlas_deepseek/cuda/mla_decode_plan.py and must match these (test_mla_decode_plan.py).
#define MLA_KEYS_ONE(T, S, RANK, ROPE, MH, KW)                                                 \
  extern "C" __global__ void __launch_bounds__(32 * MH * KW, 1) mla_decode_keys_r##RANK##_##S( \
      float* po, float* pml, const T* ql, const T* qp, const T* cache, const int* tables,      \
      const int* lens, int heads, int max_blocks, int bs, float scale_log2, int splits,        \
      int stages) {                                                                            \
    mla_decode_keys_impl<T, RANK, ROPE, MH, KW>(po, pml, ql, qp, cache, tables, lens, heads,   \
                                                max_blocks, bs, scale_log2, splits, stages);   \
  }
// Mistral-Small-4 (256 + 64): 32 heads (two m16 tiles), 4 key-warps each, 64-key tiles.
#define MLA_KEYS(T, S) MLA_KEYS_ONE(T, S, 256, 64, 2, 4)
INSTANTIATE(MLA_KEYS)
#endif
