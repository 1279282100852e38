// Logits filters that run before sampling: DRY, XTC and top-n-sigma, with the semantics of the
// NumPy references in atlas_core/ops/logits_filters.py. One block per row; every kernel writes
// a new float32 row (the input copied through for rows whose parameters switch it off).
#include "common.cuh"
#include "splitmix.cuh"

#define XTC_SEED_SALT 0x5854435F434F494Eull
#define MAX_DRY_PENALTY 1e9
// Breaker ids of a row kept in shared memory; any further ones are read from global memory.
#define SHARED_BREAKERS 64

__device__ __forceinline__ bool is_finite(float v) { return fabsf(v) <= 3.402823466e38f; }

__device__ __forceinline__ void copy_row(float* out, const float* x, int V) {
  for (int i = threadIdx.x; i < V; i += blockDim.x) out[i] = x[i];
}

// `op` over the block, in every thread: each warp's lanes, then the warps' results (`scratch`
// holds >= 32 elements; `identity` stands in for the warps a short block lacks).
template <typename T, typename Op>
__device__ T block_reduce(T v, T identity, T* scratch, Op op) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < nwarps ? scratch[lane] : identity;
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ double block_sum_d(double v, double* scratch) {
  return block_reduce(v, 0.0, scratch, [](double a, double b) { return a + b; });
}
__device__ int block_max_i(int v, int* scratch) {
  return block_reduce(v, -1, scratch, [](int a, int b) { return max(a, b); });
}

// ---- top-n-sigma: keep logit >= max - n * std over the row's finite logits -------------------

// The population std is taken in double (the reference's float64 std); the limit is rounded as
// NumPy 2 rounds float32(max) - python_float: the product cast to float32, then subtracted.
extern "C" __global__ void apply_top_n_sigma_f32(float* out, const float* logits,
                                                 const float* n_sigma, int V) {
  __shared__ float fs[32];
  __shared__ double ds[32];
  long long row = blockIdx.x;
  const float* x = logits + row * V;
  float* o = out + row * V;
  float n = n_sigma[row];
  if (!(n > 0.f)) { copy_row(o, x, V); return; }
  float m = NEG_INF;
  double sum = 0.0, count = 0.0;
  for (int i = threadIdx.x; i < V; i += blockDim.x) {
    float v = x[i];
    if (is_finite(v)) { m = fmaxf(m, v); sum += (double)v; count += 1.0; }
  }
  m = block_max(m, fs);
  sum = block_sum_d(sum, ds);
  count = block_sum_d(count, ds);
  if (count == 0.0) { copy_row(o, x, V); return; }
  double mean = sum / count, sq = 0.0;
  for (int i = threadIdx.x; i < V; i += blockDim.x) {
    float v = x[i];
    if (is_finite(v)) { double d = (double)v - mean; sq = __fma_rn(d, d, sq); }
  }
  sq = block_sum_d(sq, ds);
  float limit = m - (float)((double)n * sqrt(sq / count));
  for (int i = threadIdx.x; i < V; i += blockDim.x) {
    float v = x[i];
    o[i] = v < limit ? NEG_INF : v;
  }
}

// ---- XTC: remove every top choice (p >= threshold) but the least likely ----------------------

__device__ __forceinline__ float xtc_prob(float v, float m, float total) {
  return expf(v - m) / total;
}

// Least p (highest index on ties) and how many candidates, over the block; valid in every thread.
__device__ void block_least(float& p, int& idx, int& count, float* sp, int* si, int* sc) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
  for (int r = 0; r < 2; r++) {
    for (int o = 16; o > 0; o >>= 1) {
      float op = __shfl_xor_sync(0xffffffffu, p, o);
      int oi = __shfl_xor_sync(0xffffffffu, idx, o);
      count += __shfl_xor_sync(0xffffffffu, count, o);
      if (op < p || (op == p && oi > idx)) { p = op; idx = oi; }
    }
    if (r) break;
    __syncthreads();
    if (lane == 0) { sp[warp] = p; si[warp] = idx; sc[warp] = count; }
    __syncthreads();
    p = lane < nwarps ? sp[lane] : __int_as_float(0x7f800000);
    idx = lane < nwarps ? si[lane] : -1;
    count = lane < nwarps ? sc[lane] : 0;
  }
}

// The coin is uniform(seed ^ salt, step, 0) < probability; then p = exp(x - max) / sum with the
// sum taken in double and rounded to float32 (the reference sums float32 pairwise), so p can
// differ from the reference's by an ulp or two: only a p within that of the threshold can
// be classed differently.
extern "C" __global__ void apply_xtc_f32(float* out, const float* logits, const float* threshold,
                                         const float* probability, const u64* seeds,
                                         const long long* steps, int V) {
  __shared__ float fs[32];
  __shared__ double ds[32];
  __shared__ int si[32], sc[32];
  long long row = blockIdx.x;
  const float* x = logits + row * V;
  float* o = out + row * V;
  float thr = threshold[row], prob = probability[row];
  if (!(prob > 0.f && thr <= 0.5f) ||
      !(uniform(seeds[row] ^ XTC_SEED_SALT, (u64)steps[row], 0) < (double)prob)) {
    copy_row(o, x, V);
    return;
  }
  float m = NEG_INF;
  bool nan = false;
  for (int i = threadIdx.x; i < V; i += blockDim.x) {
    float v = x[i];
    m = fmaxf(m, v);
    nan |= v != v;
  }
  m = block_max(m, fs);
  if (__syncthreads_or(nan)) { copy_row(o, x, V); return; }  // NumPy's max is NaN: p all NaN
  double sum = 0.0;
  for (int i = threadIdx.x; i < V; i += blockDim.x) sum += (double)expf(x[i] - m);
  float total = (float)block_sum_d(sum, ds);
  float low = __int_as_float(0x7f800000);
  int keep = -1, count = 0;
  for (int i = threadIdx.x; i < V; i += blockDim.x) {
    float p = xtc_prob(x[i], m, total);
    if (p >= thr) { count++; if (p <= low) { low = p; keep = i; } }
  }
  block_least(low, keep, count, fs, si, sc);
  if (count < 2) { copy_row(o, x, V); return; }
  for (int i = threadIdx.x; i < V; i += blockDim.x) {
    float v = x[i];
    o[i] = i != keep && xtc_prob(v, m, total) >= thr ? NEG_INF : v;
  }
}

// ---- DRY: penalise tokens that would extend a repeat of the context's end --------------------

struct Breakers {
  const int* shared;
  int num_shared;
  const int* rest;  // global ids past the shared ones
  int num_rest;
  __device__ bool has(int t) const {
    if (t < 0) return false;  // padding: the reference drops negative breakers
    for (int k = 0; k < num_shared; k++) if (shared[k] == t) return true;
    for (int k = 0; k < num_rest; k++) if (rest[k] == t) return true;
    return false;
  }
};

// Tokens before the context end matched, counting back from `end` (ctx[end] == ctx[n - 1]):
// 1 + the longest k with ctx[end - k'] == ctx[n - 1 - k'] for 1 <= k' <= k and k < cap, where
// ctx[n - 1 - cap] is the last breaker before the end (a match stops at a breaker, and equal
// tokens are breakers on both sides or neither). The warp compares 32 positions a round.
__device__ int dry_match(const int* ctx, int end, int n, int cap) {
  int lane = threadIdx.x & 31;
  for (int m = 1;; m += 32) {
    int k = m + lane;
    bool same = k < cap && k <= end && ctx[end - k] == ctx[n - 1 - k];
    unsigned stop = __ballot_sync(0xffffffffu, !same);
    if (stop) return m + __ffs(stop) - 1;
  }
}

// len[t] = the longest match followed by token t; warps take 32 positions of the context at a
// time and walk each occurrence of the last token among them together.
__device__ void dry_lengths(int* len, const int* ctx, int n, int cap, int V, const Breakers& br) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  int last = ctx[n - 1];
  for (int first = warp * 32; first < n - 1; first += nwarps * 32) {
    int i = first + lane;
    bool hit = false;
    if (i < n - 1 && ctx[i] == last) {
      int t = ctx[i + 1];
      hit = t >= 0 && t < V && !br.has(t);
    }
    for (unsigned ends = __ballot_sync(0xffffffffu, hit); ends; ends &= ends - 1) {
      int end = first + __ffs(ends) - 1;
      int m = dry_match(ctx, end, n, cap);
      if (lane == 0) atomicMax(len + ctx[end + 1], m);
    }
  }
}

// lengths: [num_seqs, V] int32 scratch. token_ids: [num_seqs, max_len], padded with -1 at the
// end; breakers: [num_seqs, num_breakers], padded with -1. The penalty is computed in double,
// capped at MAX_DRY_PENALTY, rounded to float32 and subtracted, as the reference does.
extern "C" __global__ void apply_dry_f32(float* out, int* lengths, const float* logits,
                                         const int* token_ids, int max_len,
                                         const float* multiplier, const float* base,
                                         const int* allowed_length, const int* breakers,
                                         int num_breakers, int V) {
  __shared__ int sb[SHARED_BREAKERS];
  __shared__ int si[32];
  long long row = blockIdx.x;
  const float* x = logits + row * V;
  float* o = out + row * V;
  float mult = multiplier[row];
  if (!(mult > 0.f)) { copy_row(o, x, V); return; }
  int* len = lengths + row * V;
  const int* ctx = token_ids + row * max_len;
  const int* stops = breakers + row * num_breakers;
  int num_shared = min(num_breakers, SHARED_BREAKERS);
  for (int k = threadIdx.x; k < num_shared; k += blockDim.x) sb[k] = stops[k];
  for (int i = threadIdx.x; i < V; i += blockDim.x) len[i] = 0;
  int last = -1;
  for (int i = threadIdx.x; i < max_len; i += blockDim.x) if (ctx[i] >= 0) last = i;
  int n = block_max_i(last, si) + 1;
  Breakers br{sb, num_shared, stops + num_shared, num_breakers - num_shared};
  int stop = -1;
  for (int i = threadIdx.x; i < n - 1; i += blockDim.x) if (br.has(ctx[i])) stop = i;
  stop = block_max_i(stop, si);
  if (n >= 2 && !br.has(ctx[n - 1])) dry_lengths(len, ctx, n, n - 1 - stop, V, br);
  __syncthreads();
  double scale = (double)mult, growth = (double)base[row];
  int allowed = allowed_length[row];
  for (int i = threadIdx.x; i < V; i += blockDim.x) {
    float v = x[i];
    int l = __ldcg(len + i);  // written by atomics of other warps
    if (l >= allowed) {
      double penalty = scale * pow(growth, (double)((long long)l - allowed));
      v -= (float)(penalty > MAX_DRY_PENALTY ? MAX_DRY_PENALTY : penalty);
    }
    o[i] = v;
  }
}
