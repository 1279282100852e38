// atlas-nemotron-h: Mamba-2 kernels (references in atlas_nemotron_h/mamba2_reference.py and
// ffn_reference.py). Math in float32; conv and SSM state pools are float32.
// State slots: state_indices[b] < 0 is a padding row (state neither read nor written); a
// sequence whose seq_lens[b] equals its query count starts from a zero state.
#include "common.cuh"
#include "mamba2_common.cuh"

// Grid (ceil(dim / blockDim), num_seqs). A thread owns one channel of one sequence and walks
// its tokens in order, the last K - 1 inputs in registers: reads the old state first, writes
// the new one last, so no other thread touches its state column.
template <typename T>
__device__ void m2_conv1d_impl(T* out, const T* x, const T* w, const T* bias, float* states,
                               const int* cu, const int* seq_lens, const int* state_indices,
                               int dim, int k, int silu) {
  int b = blockIdx.y, ch = blockIdx.x * blockDim.x + threadIdx.x;
  if (ch >= dim) return;
  int start = cu[b], n = cu[b + 1] - start, slot = state_indices[b];
  bool has_state = slot >= 0 && seq_lens[b] > n;
  float* st = states + (long long)(slot < 0 ? 0 : slot) * (k - 1) * dim + ch;
  float win[M2_KMAX], wf[M2_KMAX];
#pragma unroll
  for (int i = 0; i < M2_KMAX; i++) {
    wf[i] = i < k ? to_f32(w[(long long)ch * k + i]) : 0.f;
    win[i] = (i < k - 1 && has_state) ? st[(long long)i * dim] : 0.f;
  }
  float bf = bias ? to_f32(bias[ch]) : 0.f;
  for (int t = 0; t < n; t++) {
    float xn = to_f32(x[(long long)(start + t) * dim + ch]);
#pragma unroll
    for (int i = 0; i < M2_KMAX; i++)
      if (i == k - 1) win[i] = xn;
    float acc = 0.f;
#pragma unroll
    for (int i = 0; i < M2_KMAX; i++)
      if (i < k) acc += win[i] * wf[i];
    acc += bf;
    out[(long long)(start + t) * dim + ch] = from_f32<T>(silu ? m2_silu(acc) : acc);
#pragma unroll
    for (int i = 0; i < M2_KMAX - 1; i++)
      if (i < k - 1) win[i] = win[i + 1];
  }
  if (slot < 0) return;
#pragma unroll
  for (int i = 0; i < M2_KMAX - 1; i++)
    if (i < k - 1) st[(long long)i * dim] = win[i];
}

// Grid (ceil(dim / blockDim), num_seqs): one new token per sequence (cu = 0, 1, ..., B).
template <typename T>
__device__ void m2_conv1d_update_impl(T* out, const T* x, const T* w, const T* bias,
                                      float* states, const int* seq_lens,
                                      const int* state_indices, int dim, int k, int silu) {
  int b = blockIdx.y, ch = blockIdx.x * blockDim.x + threadIdx.x;
  if (ch >= dim) return;
  int slot = state_indices[b];
  bool has_state = slot >= 0 && seq_lens[b] > 1;
  float* st = states + (long long)(slot < 0 ? 0 : slot) * (k - 1) * dim + ch;
  float win[M2_KMAX], acc = 0.f;
#pragma unroll
  for (int i = 0; i < M2_KMAX; i++) {
    if (i < k - 1) win[i] = has_state ? st[(long long)i * dim] : 0.f;
    if (i == k - 1) win[i] = to_f32(x[(long long)b * dim + ch]);
  }
#pragma unroll
  for (int i = 0; i < M2_KMAX; i++)
    if (i < k) acc += win[i] * to_f32(w[(long long)ch * k + i]);
  if (bias) acc += to_f32(bias[ch]);
  out[(long long)b * dim + ch] = from_f32<T>(silu ? m2_silu(acc) : acc);
  if (slot < 0) return;
#pragma unroll
  for (int i = 0; i < M2_KMAX - 1; i++)
    if (i < k - 1) st[(long long)i * dim] = win[i + 1];
}

// The selective scan token by token (prefill and decode alike, so a sequence's state does not
// depend on how its tokens were split into steps). Grid (ceil(P / M2_WARPS), H, num_seqs),
// block 32 * M2_WARPS: a warp owns one row p of head h's state [P, N], lane l the columns
// l, l + 32, ... in registers (N at most 256); y_p is a warp sum.
// xbc rows: [x (H * P), B (G * N), C (G * N)].
template <typename T>
__device__ void m2_scan_impl(T* out, const T* xbc, const T* dt, const float* a_log,
                             const float* dt_bias, const float* d_skip, float* states,
                             const int* cu, const int* seq_lens, const int* state_indices, int H,
                             int P, int G, int N, float dt_min, float dt_max) {
  int lane = threadIdx.x & 31, p = blockIdx.x * M2_WARPS + (threadIdx.x >> 5);
  int h = blockIdx.y, b = blockIdx.z;
  if (p >= P) return;
  int start = cu[b], n = cu[b + 1] - start, slot = state_indices[b];
  bool has_state = slot >= 0 && seq_lens[b] > n;
  int per = (N + 31) >> 5, g = h / (H / G);
  long long row = (long long)H * P + 2LL * G * N;
  float* st = states + (((long long)(slot < 0 ? 0 : slot) * H + h) * P + p) * N;
  float s[8];
#pragma unroll
  for (int j = 0; j < 8; j++) s[j] = (j * 32 + lane < N && has_state) ? st[j * 32 + lane] : 0.f;
  float a = -expf(a_log[h]), bias = dt_bias[h], dskip = d_skip[h];
  for (int t = start; t < start + n; t++) {
    const T* r = xbc + t * row;
    float step = m2_softplus(to_f32(dt[(long long)t * H + h]) + bias);
    step = fminf(fmaxf(step, dt_min), dt_max);
    float decay = expf(step * a), xv = to_f32(r[(long long)h * P + p]), acc = 0.f;
#pragma unroll
    for (int j = 0; j < 8; j++) {
      int col = j * 32 + lane;
      if (j < per && col < N) {
        float bv = to_f32(r[(long long)H * P + (long long)g * N + col]);
        float cv = to_f32(r[(long long)H * P + (long long)G * N + (long long)g * N + col]);
        s[j] = s[j] * decay + (step * bv) * xv;
        acc += s[j] * cv;
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0) out[((long long)t * H + h) * P + p] = from_f32<T>(acc + dskip * xv);
  }
  if (slot < 0) return;
#pragma unroll
  for (int j = 0; j < 8; j++)
    if (j < per && j * 32 + lane < N) st[j * 32 + lane] = s[j];
}

// The same scan for prefill, its time loop in chunks of tc = min(M2_CHUNK, M2_STAGE / (2 N))
// tokens: the block stages the chunk's B and C rows (float32), its x values and each token's
// step and decay in shared memory with every load in flight at once, then each warp walks the
// chunk from there (the state update is the token kernel's, so the state is bit-identical);
// the chunk's y sums over the lanes are one transposing butterfly (31 shuffles for 32 tokens,
// lane i ends with token i) instead of a 5-shuffle reduce per token. Grid and block as
// m2_scan_impl; warps past P stage and synchronise but do not scan.
template <typename T>
__device__ void m2_scan_chunked_impl(T* out, const T* xbc, const T* dt, const float* a_log,
                                     const float* dt_bias, const float* d_skip, float* states,
                                     const int* cu, const int* seq_lens,
                                     const int* state_indices, int H, int P, int G, int N,
                                     float dt_min, float dt_max) {
  __shared__ float s_bc[M2_STAGE];  // [tc][N] B, then [tc][N] C
  __shared__ float s_x[M2_CHUNK][M2_WARPS], s_step[M2_CHUNK], s_decay[M2_CHUNK];
  int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  int p = blockIdx.x * M2_WARPS + warp, h = blockIdx.y, b = blockIdx.z;
  bool live = p < P;
  int start = cu[b], n = cu[b + 1] - start, slot = state_indices[b];
  bool has_state = slot >= 0 && seq_lens[b] > n;
  int per = (N + 31) >> 5, g = h / (H / G), tc = min(M2_CHUNK, M2_STAGE / (2 * N));
  long long row = (long long)H * P + 2LL * G * N;
  long long b_off = (long long)H * P + (long long)g * N, c_off = b_off + (long long)G * N;
  float* st = states + (((long long)(slot < 0 ? 0 : slot) * H + h) * P + (live ? p : 0)) * N;
  float s[8];
#pragma unroll
  for (int j = 0; j < 8; j++)
    s[j] = (live && j * 32 + lane < N && has_state) ? st[j * 32 + lane] : 0.f;
  float a = -expf(a_log[h]), bias = dt_bias[h], dskip = d_skip[h];
  const float* sb = s_bc;
  const float* sc = s_bc + tc * N;
  for (int t0 = start; t0 < start + n; t0 += tc) {
    int m = min(tc, start + n - t0);
    __syncthreads();  // every warp is done with the previous chunk
    for (int i = tid; i < m * N; i += blockDim.x) {
      int k = i / N, col = i - k * N;
      const T* r = xbc + (t0 + k) * row;
      s_bc[i] = to_f32(r[b_off + col]);
      s_bc[tc * N + i] = to_f32(r[c_off + col]);
    }
    for (int i = tid; i < m * M2_WARPS; i += blockDim.x) {
      int k = i / M2_WARPS, pw = blockIdx.x * M2_WARPS + (i - k * M2_WARPS);
      s_x[k][i - k * M2_WARPS] = pw < P ? to_f32(xbc[(t0 + k) * row + (long long)h * P + pw]) : 0.f;
    }
    if (tid < m) {
      float step = m2_softplus(to_f32(dt[(long long)(t0 + tid) * H + h]) + bias);
      step = fminf(fmaxf(step, dt_min), dt_max);
      s_step[tid] = step;
      s_decay[tid] = expf(step * a);
    }
    __syncthreads();
    if (!live) continue;
    float acc[M2_CHUNK];
#pragma unroll
    for (int k = 0; k < M2_CHUNK; k++) {
      acc[k] = 0.f;
      if (k < m) {
        float step = s_step[k], decay = s_decay[k], xv = s_x[k][warp];
#pragma unroll
        for (int j = 0; j < 8; j++) {
          int col = j * 32 + lane;
          if (j < per && col < N) {
            s[j] = s[j] * decay + (step * sb[k * N + col]) * xv;
            acc[k] += s[j] * sc[k * N + col];
          }
        }
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      bool up = lane & o;
#pragma unroll
      for (int i = 0; i < o; i++) {
        float send = up ? acc[i] : acc[i + o];
        acc[i] = (up ? acc[i + o] : acc[i]) + __shfl_xor_sync(0xffffffffu, send, o);
      }
    }
    if (lane < m)
      out[((long long)(t0 + lane) * H + h) * P + p] = from_f32<T>(acc[0] + dskip * s_x[lane][warp]);
  }
  if (slot < 0 || !live) return;
#pragma unroll
  for (int j = 0; j < 8; j++)
    if (j < per && j * 32 + lane < N) st[j * 32 + lane] = s[j];
}

// Gated group RMSNorm: grid (groups, rows), block 128. h = y * silu(z); h / rms(h) over the
// group, rounded to T, times weight (T or float32), rounded again.
template <typename T, typename W>
__device__ void m2_gated_norm_impl(T* out, const T* y, const T* z, const W* weight, int d,
                                   int group, float eps) {
  __shared__ float red[32];
  long long base = (long long)blockIdx.y * d + (long long)blockIdx.x * group;
  float sum = 0.f;
  for (int i = threadIdx.x; i < group; i += blockDim.x) {
    float h = to_f32(y[base + i]) * m2_silu(to_f32(z[base + i]));
    sum += h * h;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = sum;
  __syncthreads();
  if (threadIdx.x < 32) {
    float v = threadIdx.x < (blockDim.x >> 5) ? red[threadIdx.x] : 0.f;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (threadIdx.x == 0) red[0] = v;
  }
  __syncthreads();
  float inv = rsqrtf(red[0] / group + eps);
  for (int i = threadIdx.x; i < group; i += blockDim.x) {
    float h = to_f32(y[base + i]) * m2_silu(to_f32(z[base + i]));
    float normed = to_f32(from_f32<T>(h * inv));
    out[base + i] = from_f32<T>(normed * to_f32(weight[(long long)blockIdx.x * group + i]));
  }
}

template <typename T>
__device__ void m2_relu2_impl(T* out, const T* x, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x) {
    float r = fmaxf(to_f32(x[i]), 0.f);
    out[i] = from_f32<T>(r * r);
  }
}

#define MAMBA2_KERNELS(T, S)                                                                  \
  extern "C" __global__ void mamba2_conv1d_##S(T* out, const T* x, const T* w, const T* bias, \
                                               float* st, const int* cu, const int* lens,     \
                                               const int* idx, int dim, int k, int silu) {    \
    m2_conv1d_impl<T>(out, x, w, bias, st, cu, lens, idx, dim, k, silu);                      \
  }                                                                                           \
  extern "C" __global__ void mamba2_conv1d_update_##S(T* out, const T* x, const T* w,         \
                                                      const T* bias, float* st,               \
                                                      const int* lens, const int* idx,        \
                                                      int dim, int k, int silu) {             \
    m2_conv1d_update_impl<T>(out, x, w, bias, st, lens, idx, dim, k, silu);                   \
  }                                                                                           \
  extern "C" __global__ void mamba2_scan_##S(T* out, const T* xbc, const T* dt,               \
                                             const float* a_log, const float* dt_bias,        \
                                             const float* d, float* st, const int* cu,        \
                                             const int* lens, const int* idx, int H, int P,   \
                                             int G, int N, float dt_min, float dt_max) {      \
    m2_scan_impl<T>(out, xbc, dt, a_log, dt_bias, d, st, cu, lens, idx, H, P, G, N, dt_min,   \
                    dt_max);                                                                  \
  }                                                                                           \
  extern "C" __global__ void mamba2_scan_chunked_##S(                                         \
      T* out, const T* xbc, const T* dt, const float* a_log, const float* dt_bias,            \
      const float* d, float* st, const int* cu, const int* lens, const int* idx, int H,       \
      int P, int G, int N, float dt_min, float dt_max) {                                      \
    m2_scan_chunked_impl<T>(out, xbc, dt, a_log, dt_bias, d, st, cu, lens, idx, H, P, G, N,   \
                            dt_min, dt_max);                                                  \
  }                                                                                           \
  extern "C" __global__ void mamba2_gated_norm_##S(T* out, const T* y, const T* z,            \
                                                   const T* w, int d, int group, float eps) { \
    m2_gated_norm_impl<T, T>(out, y, z, w, d, group, eps);                                    \
  }                                                                                           \
  extern "C" __global__ void mamba2_gated_norm_wf32_##S(T* out, const T* y, const T* z,       \
                                                        const float* w, int d, int group,     \
                                                        float eps) {                          \
    m2_gated_norm_impl<T, float>(out, y, z, w, d, group, eps);                                \
  }                                                                                           \
  extern "C" __global__ void relu2_##S(T* out, const T* x, long long n) {                     \
    m2_relu2_impl<T>(out, x, n);                                                              \
  }
INSTANTIATE(MAMBA2_KERNELS)
