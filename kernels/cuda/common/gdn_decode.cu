// Gated DeltaNet decode step as one kernel (gated_delta_rule_decode, one token per sequence):
// causal_conv1d_update (silu) of the channels a block needs, gdn_gating, the recurrent step
//   S = exp(g) S;  S += k (beta (v - S^T k))^T;  o = S^T q   (q, k L2-normalised, q scaled)
// and the gated RMSNorm over each value head's outputs, every intermediate rounded to T as
// the separate ops round it. Launched as thread block clusters (sm_90+), PDL on.
//
// A block owns `cols` = 8 * warps value columns of one value head (state slab [Dk, cols],
// float4 per thread: lanes pair up on 8 columns, 16 row groups per warp, so both reductions
// over Dk stay inside the warp). A cluster holds every block of one key head: ratio value
// heads x Dv / cols column slabs. Each block convolves the key head's q and k channels itself
// (they are shared by the whole cluster, whose blocks then split the conv-state write after a
// cluster barrier) and its own v channels; the head's norm sums its blocks' squared outputs
// through distributed shared memory. Grid (num_k_heads * cluster, num_seqs). Before
// griddepcontrol.wait only L2 prefetches run (state slab, conv-state rows, conv weights), so
// nothing read early can be stale. Opt-in (ATLAS_CUDA_GDN_DECODE=cluster): on an H200 at the
// 35B heads it took 9.05 us at batch 1 (two-kernel path 8.67) and 26.4 at batch 8 (20.0),
// latency-bound on serial L2 round trips (conv loop, old conv state, z) and three cluster
// barriers; its state loads touch 32 B per row per warp.
#include "common.cuh"

#define GD_MAX_DK 128
#define GD_MAX_COLS 32
#define GD_ROWS (GD_MAX_DK / 16)
#define GD_KMAX 8

__device__ __forceinline__ float gd_silu(float x) { return x / (1.f + expf(-x)); }

__device__ __forceinline__ void gd_prefetch(const void* p, long long bytes) {
  const char* c = (const char*)p;
  for (long long o = (long long)threadIdx.x * 128; o < bytes; o += (long long)blockDim.x * 128)
    asm volatile("prefetch.global.L2 [%0];\n" :: "l"(c + o));
}

__device__ __forceinline__ void cluster_arrive() {
#if __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void cluster_wait() {
#if __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.wait;\n" ::: "memory");
#endif
}
// `*p` as held by block `rank` of this cluster.
__device__ __forceinline__ float cluster_load(const float* p, int rank) {
#if __CUDA_ARCH__ >= 900
  u32 local = (u32)__cvta_generic_to_shared(p), remote;
  float v;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(local), "r"(rank));
  asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(remote) : "memory");
  return v;
#else
  return *p;
#endif
}

// Sum over the 16 lanes of a warp sharing bit 0 of the lane id (the 16 row groups).
__device__ __forceinline__ float rowgroup_sum(float v) {
#pragma unroll
  for (int o = 2; o < 32; o <<= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Global channel of local channel c: q (Dk), k (Dk) of key head kh, then the block's v columns.
__device__ __forceinline__ long long gd_channel(int c, int kh, int hk, int dk, long long v0) {
  return c < dk ? (long long)kh * dk + c
                : c < 2 * dk ? (long long)(hk + kh) * dk + c - dk : v0 + c - 2 * dk;
}

template <typename T>
__device__ void gdn_decode_step_impl(T* out, const T* qkv, const T* z, const T* ba,
                                     const T* conv_w, const float* a_log, const float* dt_bias,
                                     const T* norm_w, float* conv_states, float* ssm,
                                     const int* seq_lens, const int* state_indices, int hk, int hv,
                                     int dk, int dv, int k, int cols, float scale, float eps) {
  __shared__ float qk[2 * GD_MAX_DK], vs[GD_MAX_COLS], red[4], part;
  int b = blockIdx.y, ratio = hv / hk, slabs = dv / cols, csize = ratio * slabs;
  int rank = blockIdx.x % csize, kh = blockIdx.x / csize;
  int h = kh * ratio + rank / slabs, j0 = (rank % slabs) * cols;
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, rg = lane >> 1;
  int jl = warp * 8 + (lane & 1) * 4;  // first of this thread's 4 columns, within the slab
  long long dim = 2LL * hk * dk + (long long)hv * dv, v0 = 2LL * hk * dk + (long long)h * dv + j0;
  int nch = 2 * dk + cols;
  pdl_trigger();
  {
    int hint = state_indices[b] < 0 ? 0 : state_indices[b];  // written before the step began
    const float* slab = ssm + ((long long)hint * hv + h) * dk * dv + j0;
    for (int i = threadIdx.x; i < dk; i += blockDim.x)
      asm volatile("prefetch.global.L2 [%0];\n" :: "l"(slab + (long long)i * dv));
    const float* cst = conv_states + (long long)hint * (k - 1) * dim;
    for (int r = 0; r < k - 1; r++) {
      gd_prefetch(cst + r * dim + gd_channel(0, kh, hk, dk, v0), 4LL * dk);
      gd_prefetch(cst + r * dim + gd_channel(dk, kh, hk, dk, v0), 4LL * dk);
      gd_prefetch(cst + r * dim + v0, 4LL * cols);
    }
    gd_prefetch(conv_w + gd_channel(0, kh, hk, dk, v0) * k, (long long)sizeof(T) * dk * k);
    gd_prefetch(conv_w + gd_channel(dk, kh, hk, dk, v0) * k, (long long)sizeof(T) * dk * k);
    gd_prefetch(conv_w + v0 * k, (long long)sizeof(T) * cols * k);
  }
  pdl_wait();
  int slot = state_indices[b];
  bool has_state = slot >= 0 && seq_lens[b] > 1;
  float* sp = ssm + ((long long)(slot < 0 ? 0 : slot) * hv + h) * dk * dv + j0 + jl;
  float4 s[GD_ROWS];
#pragma unroll
  for (int m = 0; m < GD_ROWS; m++) {
    int i = rg + 16 * m;
    s[m] = has_state && i < dk ? *reinterpret_cast<const float4*>(sp + (long long)i * dv)
                               : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  float* cst = conv_states + (long long)(slot < 0 ? 0 : slot) * (k - 1) * dim;
  const T* xrow = qkv + b * dim;
  for (int c = threadIdx.x; c < nch; c += blockDim.x) {
    long long ch = gd_channel(c, kh, hk, dk, v0);
    float acc = 0.f;
#pragma unroll
    for (int i = 0; i < GD_KMAX; i++) {
      if (i < k - 1) acc += to_f32(conv_w[ch * k + i]) * (has_state ? cst[i * dim + ch] : 0.f);
      else if (i == k - 1) acc += to_f32(conv_w[ch * k + i]) * to_f32(xrow[ch]);
    }
    float y = to_f32(from_f32<T>(gd_silu(acc)));
    if (c < 2 * dk) qk[c] = y; else vs[c - 2 * dk] = y;
  }
  cluster_arrive();  // #1: this block has read the old conv state
  long long bh = (long long)b * hv + h;
  float bv = to_f32(ba[b * 2LL * hv + h]), av = to_f32(ba[b * 2LL * hv + hv + h]) + dt_bias[h];
  float softplus = av > 20.f ? av : log1pf(expf(fminf(av, 20.f)));
  float decay = expf(-expf(a_log[h]) * softplus), beta = 1.f / (1.f + expf(-bv));
  __syncthreads();
  const float* qs = qk;
  const float* ks = qk + dk;
  float sq = 0.f, sk = 0.f;
  for (int i = lane; i < dk; i += 32) { sq += qs[i] * qs[i]; sk += ks[i] * ks[i]; }
  float qscale = scale * rsqrtf(warp_sum(sq) + 1e-6f), kscale = rsqrtf(warp_sum(sk) + 1e-6f);
  float kv[4] = {0.f, 0.f, 0.f, 0.f}, o[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int m = 0; m < GD_ROWS; m++) {
    int i = rg + 16 * m;
    if (i < dk) {
      float ki = ks[i];
      s[m].x *= decay; s[m].y *= decay; s[m].z *= decay; s[m].w *= decay;
      kv[0] += s[m].x * ki; kv[1] += s[m].y * ki; kv[2] += s[m].z * ki; kv[3] += s[m].w * ki;
    }
  }
  float delta[4];
#pragma unroll
  for (int c = 0; c < 4; c++)
    delta[c] = (vs[jl + c] - rowgroup_sum(kv[c]) * kscale) * beta * kscale;
#pragma unroll
  for (int m = 0; m < GD_ROWS; m++) {
    int i = rg + 16 * m;
    if (i < dk) {
      float ki = ks[i], qi = qs[i];
      s[m].x += ki * delta[0]; s[m].y += ki * delta[1];
      s[m].z += ki * delta[2]; s[m].w += ki * delta[3];
      o[0] += s[m].x * qi; o[1] += s[m].y * qi; o[2] += s[m].z * qi; o[3] += s[m].w * qi;
      if (slot >= 0) *reinterpret_cast<float4*>(sp + (long long)i * dv) = s[m];
    }
  }
  float osq = 0.f;
#pragma unroll
  for (int c = 0; c < 4; c++) {
    o[c] = to_f32(from_f32<T>(rowgroup_sum(o[c]) * qscale));
    osq += o[c] * o[c];
  }
  osq = warp_sum(lane < 2 ? osq : 0.f);
  if (lane == 0) red[warp] = osq;
  cluster_wait();  // #1: every block of the cluster has read the old conv state
  if (slot >= 0) {
    int per = (2 * dk + csize - 1) / csize, lo = rank * per;
    int n_qk = max(0, min(2 * dk, lo + per) - lo);
    for (int t = threadIdx.x; t < n_qk + cols; t += blockDim.x) {
      long long ch = gd_channel(t < n_qk ? lo + t : 2 * dk + t - n_qk, kh, hk, dk, v0);
      float nv[GD_KMAX];
#pragma unroll
      for (int r = 0; r < GD_KMAX - 1; r++)
        if (r < k - 1)
          nv[r] = r + 1 < k - 1 ? (has_state ? cst[(r + 1) * dim + ch] : 0.f) : to_f32(xrow[ch]);
#pragma unroll
      for (int r = 0; r < GD_KMAX - 1; r++)
        if (r < k - 1) cst[r * dim + ch] = nv[r];
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float p = 0.f;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++) p += red[w];
    part = p;
  }
  cluster_arrive();  // #2: part is written
  cluster_wait();
  float total = 0.f;
  for (int r = rank - rank % slabs; r < rank - rank % slabs + slabs; r++)
    total += cluster_load(&part, r);
  cluster_arrive();  // #3: this block is done reading the others' shared memory
  float inv = rsqrtf(total / dv + eps);
  if (lane < 2) {
#pragma unroll
    for (int c = 0; c < 4; c++) {
      long long oi = bh * dv + j0 + jl + c;
      float zv = to_f32(z[oi]);
      out[oi] = from_f32<T>(o[c] * inv * to_f32(norm_w[j0 + jl + c]) * (zv / (1.f + expf(-zv))));
    }
  }
  cluster_wait();  // #3: no block leaves while another may still read its `part`
}

#define GDN_DECODE(T, S)                                                                       \
  extern "C" __global__ void __launch_bounds__(128) gdn_decode_step_##S(                       \
      T* out, const T* qkv, const T* z, const T* ba, const T* conv_w, const float* a_log,      \
      const float* dt_bias, const T* norm_w, float* conv_states, float* ssm,                   \
      const int* seq_lens, const int* idx, int hk, int hv, int dk, int dv, int k, int cols,    \
      float scale, float eps) {                                                                \
    gdn_decode_step_impl<T>(out, qkv, z, ba, conv_w, a_log, dt_bias, norm_w, conv_states, ssm, \
                            seq_lens, idx, hk, hv, dk, dv, k, cols, scale, eps);               \
  }
INSTANTIATE(GDN_DECODE)
