// atlas-deepseek: what the tensor-core MLA decode kernels share (mla_decode_mma.cu,
// mla_decode_keys.cu, mla_decode_keys2.cu): a split's key range, the query rows and the paged
// latent tiles copied into shared memory through a cp.async ring, the online-softmax step of a
// warp's m16 score fragment, and (for the key-split kernels) P . V and the merge of the key
// groups' partial (m, l, O) into the partials mla_decode_combine reads. Include after
// common.cuh and mma.cuh, inside the kernel file's #if ATLAS_MMA (the source inliner does not
// deduplicate nested includes).
#pragma once

// Keys [k0, k1) of context split `split` of a `len`-key sequence, in `ntiles` tiles of BN:
// splits own whole tiles, so only a split's last tile is partial.
template <int BN>
__device__ __forceinline__ void mla_split_keys(int len, int splits, int split, int& k0, int& k1,
                                               int& ntiles) {
  int chunk = ((len + splits - 1) / splits + BN - 1) / BN * BN;
  k0 = min(len, split * chunk);
  k1 = min(len, k0 + chunk);
  ntiles = (k1 - k0 + BN - 1) / BN;
}

// Rows h0 .. h0 + HT of sequence b's queries, [latent | rope] into sq [HT][RANK + ROPE + 8];
// heads past `heads` are zero-filled.
template <typename T, int RANK, int ROPE, int HT, int THREADS>
__device__ __forceinline__ void mla_load_queries(T* sq, const T* q_lat, const T* q_pe, int b,
                                                 int h0, int heads, int tid) {
  constexpr int W = RANK + ROPE, LD = W + 8, CH = W / 8;
  for (int c = tid; c < HT * CH; c += THREADS) {
    int r = c / CH, col = (c % CH) * 8, h = h0 + r;
    bool ok = h < heads;
    long long row = (long long)b * heads + (ok ? h : 0);
    const T* src = col < RANK ? q_lat + row * RANK + col : q_pe + row * ROPE + (col - RANK);
    cp_async16(sq + r * LD + col, src, ok);
  }
}

// Waits until the ring's oldest tile has landed: `stages` - 1 + it groups committed when tile
// `it` is needed, so stages - 2 may stay in flight.
// The ring's copies: load(buffer, tile) issues tile `tile`'s copies into ring buffer `buffer`,
// one commit group a tile (empty past ntiles). mla_ring_prime before the loop: tiles 0 ..
// stages - 2 (group 0 also holds the queries); mla_ring_next in iteration it, after the barrier
// that frees tile it - 1's buffer: tile it + stages - 1 into it.
template <typename Load>
__device__ __forceinline__ void mla_ring_prime(int stages, int ntiles, const Load& load) {
  for (int s = 0; s < stages - 1; s++) {
    if (s < ntiles) load(s, s);
    asm volatile("cp.async.commit_group;\n");
  }
}
template <typename Load>
__device__ __forceinline__ void mla_ring_next(int it, int stages, int ntiles, const Load& load) {
  int nx = it + stages - 1;
  if (nx < ntiles) load(nx % stages, nx);
  asm volatile("cp.async.commit_group;\n");
}
__device__ __forceinline__ void mla_wait_ring(int stages) {
  if (stages >= 4) asm volatile("cp.async.wait_group 2;\n");
  else if (stages == 3) asm volatile("cp.async.wait_group 1;\n");
  else asm volatile("cp.async.wait_group 0;\n");
}

// Copies a BN-key tile of the paged latent cache (keys t0 .., zero past k1) into shared rows
// of RANK + ROPE + 8; power-of-two pages (16, 64: all in practice) gather by shifts.
template <typename T, int W, int BN, int THREADS>
struct MlaTileGather {
  const T* cache;
  const int* table;
  int block_size, bshift, k1;

  __device__ __forceinline__ MlaTileGather(const T* cache, const int* table, int block_size,
                                           int k1)
      : cache(cache), table(table), block_size(block_size),
        bshift((block_size & (block_size - 1)) == 0 ? __ffs(block_size) - 1 : -1), k1(k1) {}

  __device__ __forceinline__ void operator()(T* dst, int t0, int tid) const {
    constexpr int LD = W + 8, CH = W / 8;
    for (int c = tid; c < BN * CH; c += THREADS) {
      int r = c / CH, col = (c % CH) * 8, j = t0 + r;
      bool ok = j < k1;
      int blk = bshift >= 0 ? j >> bshift : j / block_size;
      int off = bshift >= 0 ? j & (block_size - 1) : j % block_size;
      long long row = ok ? (long long)__ldg(table + blk) * block_size + off : 0;
      cp_async16(dst + r * LD + col, cache + row * W + col, ok);
    }
  }
};

// One online-softmax step (exp2 domain) of a warp's m16 x (8 * NS) score fragment in the
// mma.sync accumulator layout (element e of n8 tile n: row lane / 4 + 8 * (e >> 1), key
// j0 + n * 8 + (lane & 3) * 2 + (e & 1)): the raw scores `s` are scaled, keys at or past k1
// masked to -inf, the two rows' running max m and sum l updated, the ND n8 tiles of the output
// o rescaled when a max moved (skipped once it settles: most tiles of a long context), and `s`
// turned into the tile's probabilities.
template <int NS, int ND>
__device__ __forceinline__ void mma_softmax_step(float (&s)[NS][4], float (&m)[2],
                                                 float (&l)[2], float (&o)[ND][4], int j0,
                                                 int k1, float scale_log2, int lane) {
  float mx[2] = {m[0], m[1]};
#pragma unroll
  for (int n = 0; n < NS; n++)
#pragma unroll
    for (int e = 0; e < 4; e++) {
      int j = j0 + n * 8 + (lane & 3) * 2 + (e & 1);
      float v = j < k1 ? s[n][e] * scale_log2 : NEG_INF;
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
  if (__any_sync(0xffffffffu, corr[0] != 1.f || corr[1] != 1.f)) {
#pragma unroll
    for (int n = 0; n < ND; n++) {
      o[n][0] *= corr[0]; o[n][1] *= corr[0]; o[n][2] *= corr[1]; o[n][3] *= corr[1];
    }
  }
#pragma unroll
  for (int n = 0; n < NS; n++)
#pragma unroll
    for (int e = 0; e < 4; e++) {
      float p = m[e >> 1] == NEG_INF ? 0.f : exp2f(s[n][e] - m[e >> 1]);
      s[n][e] = p;
      l[e >> 1] += p;
    }
}

// O[16 x 8 * ND] += P[16 x 16] . V, V the 16 key rows at vrow (this lane's ldmatrix address
// of the first column), P the probabilities of mma_softmax_step with NS = 2.
template <typename T, int ND>
__device__ __forceinline__ void mma_pv_16keys(float (&o)[ND][4], const float (&p)[2][4],
                                              const T* vrow) {
  u32 pa[4] = {pack2<T>(p[0][0], p[0][1]), pack2<T>(p[0][2], p[0][3]),
               pack2<T>(p[1][0], p[1][1]), pack2<T>(p[1][2], p[1][3])};
#pragma unroll
  for (int n = 0; n < ND; n += 2) {
    u32 vf[4];
    ldmatrix_x4_trans(vf, vrow + n * 8);
    u32 b0[2] = {vf[0], vf[1]}, b1[2] = {vf[2], vf[3]};
    mma16816<T>(o[n], pa, b0);
    mma16816<T>(o[n + 1], pa, b1);
  }
}

// After the last tile of the key-split kernels: the KW key groups of each 16-head tile merge
// their (m, l, O) once through shared memory (sacc [KW][HT][RANK + 8] floats, over the ring
// and the queries, which every warp is done with), and the block writes split `split`'s
// partials: natural-log max and sum per head (part_ml), the weighted O rows (part_o). A warp
// stores its ND n8 tiles at columns col0 ..; `writes_ml` warps store m and l (one per key
// group and head tile). Call after a __syncthreads that ends the loop.
template <int RANK, int HT, int KW, int THREADS, int ND>
__device__ __forceinline__ void mla_merge_key_groups(
    float* sacc, float (*sm_m)[HT], float (*sm_l)[HT], float (*sm_w)[HT],
    const float (&o)[ND][4], const float (&m)[2], float (&l)[2], bool active, bool writes_ml,
    int row, int kw, int col0, float* part_o, float* part_ml, int b, int splits, int split,
    int h0, int heads, int lane, int tid) {
  constexpr int MLD = RANK + 8;  // merge row stride in floats: conflict-free float2 stores
#pragma unroll
  for (int r = 0; r < 2; r++) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
  if (active) {
    float* dst = sacc + (kw * HT + row) * MLD + col0 + (lane & 3) * 2;
#pragma unroll
    for (int r = 0; r < 2; r++)
#pragma unroll
      for (int n = 0; n < ND; n++)
        *reinterpret_cast<float2*>(dst + r * 8 * MLD + n * 8) =
            make_float2(o[n][2 * r], o[n][2 * r + 1]);
    if (writes_ml && (lane & 3) == 0) {
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
