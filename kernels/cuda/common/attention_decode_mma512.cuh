// The tensor-core decode kernel at head dim 512 (attention_decode_mma.cu instantiates it as
// attn_dec_mma_<dtype>_d512_h<HB>): included there after its shared pieces (DM_THREADS,
// find_seq, dec_last_split / dec_combine, the mma helpers).
#pragma once

// D = 512 (Gemma-4's full-attention heads). A warp holding a 16 x 512 output tile would need
// 256 accumulator registers a thread, so the four warps share a tile of DW_BN = 32 keys the
// other way round: warp w scores keys 8w .. 8w + 7 over all 512 dims (one n8 mma tile), the
// block agrees on each row's running max through shared memory, each warp writes its keys'
// probabilities (T) into a shared P tile, then warp w multiplies all 32 keys' P into V's columns
// 128w .. 128w + 127 (64 accumulators a thread). The running max is the block's, so the warps'
// softmax sums add at the end and no partials merge in the block. Three ring stages of 32 keys
// (216 KB of dynamic shared memory: one block an SM, two tiles of K/V in flight). Why: the
// CUDA-core swa_split of atlas-gemma4 takes two query heads a block at 512 and so reads each KV
// head's cache four times at Gemma-4's groups of 8; it ran ~10x the bytes' time at 32k tokens.
constexpr int DW_D = 512, DW_BN = 32, DW_NST = 3, DW_COLS = DW_D / 4, DW_PLD = DW_BN + 8;

// MERGE: the last split block merges the partials (dec_combine); false leaves them to
// attn_dec_merge_impl below, a kernel of its own (policy decode_merge=kernel).
template <typename T, int HB, bool MERGE = true>
__device__ void attn_dec_mma512_impl(T* out, float* part_acc, float* part_ml, int* counters,
                                     const T* q, const T* kb, const T* vb,
                                     const int* block_tables, const int* seq_lens,
                                     const int* cu_q, AttnArgs a) {
  constexpr int D = DW_D, LD = D + 8, KSTEPS = D / 16, CH = D / 8, NT = DW_COLS / 8;
  static_assert(HB <= 16, "16 query rows a tile");
  extern __shared__ __align__(16) unsigned char dm_smem[];
  T* sq = reinterpret_cast<T*>(dm_smem);  // [16][LD]
  T* ring = sq + 16 * LD;                 // [DW_NST][K, V][DW_BN][LD]
  __shared__ __align__(16) T sp[16][DW_PLD];
  __shared__ float red[4][16];
  pdl_wait();  // launched with PDL after rope, which writes the newest key: wait first
  int t = blockIdx.x, split = blockIdx.z;
  int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  int H = a.num_heads, KH = a.num_kv_heads, G = H / KH, chunks = G / HB;
  int kh = blockIdx.y / chunks, h0 = kh * G + (blockIdx.y % chunks) * HB;
  int b = find_seq(cu_q, a.num_seqs, t);
  int n_q = cu_q[b + 1] - cu_q[b], i = t - cu_q[b];
  const int* bt_row = block_tables + (long long)b * a.max_blocks;
  int len = seq_lens[b] - n_q + i + 1;
  int lo = a.window > 0 ? max(0, len - a.window) : 0, span = len - lo;
  int chunk = (max(span, 1) + a.num_splits - 1) / a.num_splits;
  chunk = (chunk + DW_BN - 1) / DW_BN * DW_BN;
  int n_act = max(1, (span + chunk - 1) / chunk);
  if (split >= n_act) return;
  int start = lo + split * chunk, end = min(start + chunk, len);
  int rounds = (end - start + DW_BN - 1) / DW_BN;

  for (int c = tid; c < 16 * CH; c += DM_THREADS) {
    int r = c / CH, col = (c % CH) * 8;
    bool ok = r < HB;
    cp_async16(sq + r * LD + col, q + ((long long)t * H + h0 + (ok ? r : 0)) * D + col, ok);
  }
  auto issue = [&](int round) {
    T* dk = ring + (round % DW_NST) * 2 * DW_BN * LD;
    T* dv = dk + DW_BN * LD;
    int j0 = start + round * DW_BN;
#pragma unroll
    for (int s = 0; s < DW_BN * CH / DM_THREADS; s++) {
      int c = tid + s * DM_THREADS, r = c / CH, col = (c % CH) * 8, j = j0 + r;
      bool ok = j < end;
      int blk = a.block_size == 16 ? j >> 4 : j / a.block_size;
      int off = a.block_size == 16 ? j & 15 : j % a.block_size;
      long long row = ok ? ((long long)__ldg(bt_row + blk) * a.block_size + off) * KH + kh : 0;
      cp_async16(dk + r * LD + col, kb + row * D + col, ok);
      cp_async16(dv + r * LD + col, vb + row * D + col, ok);
    }
  };
#pragma unroll
  for (int s = 0; s < DW_NST - 1; s++) {
    if (s < rounds) issue(s);
    asm volatile("cp.async.commit_group;\n");
  }

  float o[NT][4], m[2] = {NEG_INF, NEG_INF}, l[2] = {0.f, 0.f};
#pragma unroll
  for (int n = 0; n < NT; n++)
#pragma unroll
    for (int e = 0; e < 4; e++) o[n][e] = 0.f;
  float scale = a.scale_log2 * a.kv_scale;
  int key0 = warp * 8, col0 = warp * DW_COLS, r0 = lane >> 2;
  for (int it = 0; it < rounds; it++) {
    asm volatile("cp.async.wait_group 1;\n");
    __syncthreads();  // tile `it` landed for everyone; the slot of tile it - 1 is free
    if (it + DW_NST - 1 < rounds) issue(it + DW_NST - 1);
    asm volatile("cp.async.commit_group;\n");
    const T* tk = ring + (it % DW_NST) * 2 * DW_BN * LD;
    const T* tv = tk + DW_BN * LD;
    // scores of this warp's 8 keys: one ldmatrix_x4 of K serves two k-steps; four accumulators
    // so that no mma waits on the one before (a chain of 8, not 32)
    float sa[4][4] = {};
#pragma unroll
    for (int kk = 0; kk < KSTEPS; kk += 2) {
      u32 kf[4], qa[4];
      ldmatrix_x4(kf, tk + (key0 + (lane & 7)) * LD + kk * 16 + (lane >> 3) * 8);
      u32 b0[2] = {kf[0], kf[1]}, b1[2] = {kf[2], kf[3]};
      ldmatrix_x4(qa, sq + (lane & 15) * LD + kk * 16 + (lane >> 4) * 8);
      mma16816<T>(sa[kk & 2], qa, b0);
      ldmatrix_x4(qa, sq + (lane & 15) * LD + (kk + 1) * 16 + (lane >> 4) * 8);
      mma16816<T>(sa[(kk & 2) + 1], qa, b1);
    }
    float s[4];
#pragma unroll
    for (int e = 0; e < 4; e++) s[e] = (sa[0][e] + sa[1][e]) + (sa[2][e] + sa[3][e]);
    int j0 = start + it * DW_BN + key0 + (lane & 3) * 2;
    float mx[2] = {NEG_INF, NEG_INF};
#pragma unroll
    for (int e = 0; e < 4; e++) {
      float v = j0 + (e & 1) < end ? s[e] * scale : NEG_INF;
      s[e] = v;
      mx[e >> 1] = fmaxf(mx[e >> 1], v);
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
    }
    if ((lane & 3) == 0) { red[warp][r0] = mx[0]; red[warp][r0 + 8] = mx[1]; }
    __syncthreads();  // every warp's row maxima of this tile
    float corr[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
      int row = r0 + 8 * r;
      float mn = fmaxf(fmaxf(m[r], fmaxf(red[0][row], red[1][row])),
                       fmaxf(red[2][row], red[3][row]));
      corr[r] = mn == NEG_INF ? 1.f : exp2f(m[r] - mn);
      m[r] = mn;
      l[r] *= corr[r];
    }
#pragma unroll
    for (int e = 0; e < 4; e++) {
      int r = e >> 1;
      float p = m[r] == NEG_INF ? 0.f : exp2f(s[e] - m[r]);
      s[e] = p;
      l[r] += p;
    }
    *reinterpret_cast<u32*>(&sp[r0][key0 + (lane & 3) * 2]) = pack2<T>(s[0], s[1]);
    *reinterpret_cast<u32*>(&sp[r0 + 8][key0 + (lane & 3) * 2]) = pack2<T>(s[2], s[3]);
    // the max is the block's, so corr is the same in every warp: skip the rescale once it settles
    if (__any_sync(0xffffffffu, corr[0] != 1.f || corr[1] != 1.f)) {
#pragma unroll
      for (int n = 0; n < NT; n++) {
        o[n][0] *= corr[0]; o[n][1] *= corr[0]; o[n][2] *= corr[1]; o[n][3] *= corr[1];
      }
    }
    __syncthreads();  // the P tile is whole
#pragma unroll
    for (int ks = 0; ks < DW_BN / 16; ks++) {
      u32 pa[4];
      ldmatrix_x4(pa, &sp[lane & 15][ks * 16 + (lane >> 4) * 8]);
#pragma unroll
      for (int n = 0; n < NT; n += 2) {
        u32 vf[4];
        ldmatrix_x4_trans(vf, tv + (ks * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + col0 +
                                  n * 8 + (lane >> 4) * 8);
        u32 b0[2] = {vf[0], vf[1]}, b1[2] = {vf[2], vf[3]};
        mma16816<T>(o[n], pa, b0);
        mma16816<T>(o[n + 1], pa, b1);
      }
    }
  }
  asm volatile("cp.async.wait_group 0;\n");
  // Only now let the next kernel launch: with the trigger at the start, gemma-4-31b's batch-1
  // step at 1,024 tokens took 18.65 ms, with it here 17.90 (H200, session 24; the early-launched
  // o_proj blocks held SMs these 216 KB blocks need). The 64-256 kernel above keeps its early
  // trigger: moved there, qwen3-8b at 8,192 tokens batch 8 read 8.04 ms against 7.68.
  pdl_trigger();
  // the block's softmax sums: this thread's keys, its quad's, then the four warps'
#pragma unroll
  for (int r = 0; r < 2; r++) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
  __syncthreads();  // every warp read the last tile's maxima
  if ((lane & 3) == 0) { red[warp][r0] = l[0]; red[warp][r0 + 8] = l[1]; }
  __syncthreads();
  long long th0 = (long long)t * H + h0;
  bool single = n_act == 1;
#pragma unroll
  for (int r = 0; r < 2; r++) {
    int row = r0 + 8 * r;
    if (row >= HB) continue;
    float L = red[0][row] + red[1][row] + red[2][row] + red[3][row];
    long long th = th0 + row;
    float f = L > 0.f ? a.kv_scale / L : 0.f;
#pragma unroll
    for (int n = 0; n < NT; n++) {
      int col = col0 + n * 8 + (lane & 3) * 2;
      if (single) {
        *reinterpret_cast<u32*>(out + th * D + col) =
            pack2<T>(o[n][2 * r] * f, o[n][2 * r + 1] * f);
      } else {
        *reinterpret_cast<float2*>(part_acc + (th * a.num_splits + split) * D + col) =
            make_float2(o[n][2 * r], o[n][2 * r + 1]);
      }
    }
    if (!single && warp == 0 && (lane & 3) == 0) {
      part_ml[(th * a.num_splits + split) * 2] = m[r];
      part_ml[(th * a.num_splits + split) * 2 + 1] = L;
    }
  }
  if constexpr (!MERGE) return;
  if (single || !dec_last_split(counters, t, n_act)) return;
  dec_combine<T, D, HB>(out, part_acc, part_ml, th0, a.num_splits, n_act, a.kv_scale);
}

// The split partials of one (query token, head) of the split kernels with MERGE false (this
// one, or attn_dec_mma_impl at 64-256 with BN = 64), merged by a block of D / 4 threads (grid:
// tokens x heads; launched with PDL after it). Why: the last split block merging a whole GQA
// group's partials alone reads them with one SM (~1 MB at Gemma-4 26B-A4B's 8 heads of 512 and
// a wave of splits, so the 512 plan took 4 heads a block and read each KV head's cache twice;
// 0.5 MB at 16 heads of 128 or 8 of 256 and 64 splits). The split count follows the split
// kernel's rule (the same span, chunk and n_act); a token with one active split was written by
// the split kernel.
template <typename T, int D, int BN>
__device__ void attn_dec_merge_impl(T* out, const float* part_acc, const float* part_ml,
                                    const int* seq_lens, const int* cu_q, int H, int num_seqs,
                                    int num_splits, int window, float kv_scale) {
  pdl_trigger();
  pdl_wait();
  int t = blockIdx.x, h = blockIdx.y;
  int b = find_seq(cu_q, num_seqs, t);
  int n_q = cu_q[b + 1] - cu_q[b], i = t - cu_q[b];
  int len = seq_lens[b] - n_q + i + 1;
  int lo = window > 0 ? max(0, len - window) : 0, span = len - lo;
  int chunk = (max(span, 1) + num_splits - 1) / num_splits;
  chunk = (chunk + BN - 1) / BN * BN;
  int n_act = max(1, (span + chunk - 1) / chunk);
  if (n_act == 1) return;
  dec_combine<T, D, 1>(out, part_acc, part_ml, (long long)t * H + h, num_splits, n_act,
                       kv_scale);
}
