// Logits -> tokens on the device: argmax, log-softmax, top-k, penalties and seeded sampling.
// One block per row (argmax and sampling also split a row over blocks); logits are float32.
// The sampler's random stream is the splitmix64 hash of (seed, step, index) used by the NumPy
// reference, so seeded choices match it.
#include "common.cuh"
#include "splitmix.cuh"

extern "C" __global__ void log_softmax_f32(float* out, const float* logits, int V) {
  __shared__ float scratch[32];
  const float* x = logits + (long long)blockIdx.x * V;
  float m = NEG_INF;
  for (int i = threadIdx.x; i < V; i += blockDim.x) m = fmaxf(m, x[i]);
  m = block_max(m, scratch);
  float s = 0.f;
  for (int i = threadIdx.x; i < V; i += blockDim.x) s += __expf(x[i] - m);
  float lse = m + logf(block_sum(s, scratch));
  for (int i = threadIdx.x; i < V; i += blockDim.x) out[(long long)blockIdx.x * V + i] = x[i] - lse;
}

// k passes: each finds the largest element strictly after the previous in (value desc, index asc).
extern "C" __global__ void topk_f32(float* values, int* indices, const float* x_all, int V, int k) {
  __shared__ float sv[32];
  __shared__ int si[32];
  const float* x = x_all + (long long)blockIdx.x * V;
  float prev_v = __int_as_float(0x7f800000); int prev_i = -1;
  for (int j = 0; j < k; j++) {
    float v = NEG_INF; int idx = 0x7fffffff;
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
      float s = x[i];
      if (s < prev_v || (s == prev_v && i > prev_i)) argmax_pair(v, idx, s, i);
    }
    block_argmax(v, idx, sv, si);
    if (threadIdx.x == 0) { values[blockIdx.x * k + j] = v; indices[blockIdx.x * k + j] = idx; }
    prev_v = v; prev_i = idx;
  }
}

// counts: [num_seqs, V] int32 scratch; bit 30 marks tokens seen in the prompt.
extern "C" __global__ void apply_penalties_f32(float* out, int* counts, const float* logits,
                                               const int* prompt_ids, int prompt_len,
                                               const int* output_ids, int output_len,
                                               const float* rep, const float* pres,
                                               const float* freq, int V) {
  long long row = blockIdx.x;
  int* c = counts + row * V;
  for (int i = threadIdx.x; i < V; i += blockDim.x) c[i] = 0;
  __syncthreads();
  for (int i = threadIdx.x; i < output_len; i += blockDim.x) {
    int id = output_ids[row * output_len + i];
    if (id >= 0 && id < V) atomicAdd(c + id, 1);
  }
  for (int i = threadIdx.x; i < prompt_len; i += blockDim.x) {
    int id = prompt_ids[row * prompt_len + i];
    if (id >= 0 && id < V) atomicOr(c + id, 1 << 30);
  }
  __syncthreads();
  float r = rep[row], p = pres[row], f = freq[row];
  for (int i = threadIdx.x; i < V; i += blockDim.x) {
    int ci = c[i];
    float n = (float)(ci & ((1 << 30) - 1));
    float x = logits[row * V + i];
    if (r != 1.f && ci != 0) x = x > 0.f ? x / r : x * r;
    out[row * V + i] = x - (f * n + p * (n > 0.f ? 1.f : 0.f));
  }
}

// Largest (double value, index) over the block, lowest index on ties; valid in thread 0.
__device__ void block_argmax_d(double& best, int& idx) {
  __shared__ double sb[32];
  __shared__ int sbi[32];
  for (int o = 16; o > 0; o >>= 1) {
    double ob = __shfl_xor_sync(0xffffffffu, best, o);
    int oi = __shfl_xor_sync(0xffffffffu, idx, o);
    if (ob > best || (ob == best && oi < idx)) { best = ob; idx = oi; }
  }
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  __syncthreads();
  if (lane == 0) { sb[warp] = best; sbi[warp] = idx; }
  __syncthreads();
  if (threadIdx.x == 0)
    for (int w = 1; w < nw; w++)
      if (sb[w] > best || (sb[w] == best && sbi[w] < idx)) { best = sb[w]; idx = sbi[w]; }
}

// Smallest float v (searched over its bits) with pred(v) true, for a monotone pred.
// mode 0: count(p >= v) < k  -> threshold just above the k-th largest
// mode 1: sum(p > v) < target -> top-p cut
__device__ float bisect(const float* p, int V, int mode, float target, float* scratch) {
  u32 lo = 0, hi = 0x3f800001u;
  while (lo < hi) {
    u32 mid = (lo + hi) >> 1;
    float v = __uint_as_float(mid), acc = 0.f;
    for (int i = threadIdx.x; i < V; i += blockDim.x)
      acc += mode == 0 ? (p[i] >= v ? 1.f : 0.f) : (p[i] > v ? p[i] : 0.f);
    acc = block_sum(acc, scratch);
    if (acc < target) hi = mid; else lo = mid + 1;
  }
  return __uint_as_float(lo);
}

// Filter (top-k, top-p, min-p) and draw one row's token with one block; thread 0's result.
__device__ int sample_row(float* p, const float* x, int V, float t, int k, float tp, float mp,
                          u64 seed, u64 step, float* scratch) {
  float m = NEG_INF;
  for (int i = threadIdx.x; i < V; i += blockDim.x) m = fmaxf(m, x[i] / t);
  m = block_max(m, scratch);
  float s = 0.f;
  for (int i = threadIdx.x; i < V; i += blockDim.x) { float e = expf(x[i] / t - m); p[i] = e; s += e; }
  s = block_sum(s, scratch);
  for (int i = threadIdx.x; i < V; i += blockDim.x) p[i] /= s;
  __syncthreads();
  if (k > 0 && k < V) {
    float kth = bisect(p, V, 0, (float)k, scratch);   // smallest v with count(p >= v) < k
    float hi = NEG_INF;                               // the k-th largest value is below kth
    for (int i = threadIdx.x; i < V; i += blockDim.x) if (p[i] < kth) hi = fmaxf(hi, p[i]);
    hi = block_max(hi, scratch);
    for (int i = threadIdx.x; i < V; i += blockDim.x) if (p[i] < hi) p[i] = 0.f;
    __syncthreads();
  }
  if (tp < 1.f) {
    float total = 0.f;
    for (int i = threadIdx.x; i < V; i += blockDim.x) total += p[i];
    total = block_sum(total, scratch);
    float v0 = bisect(p, V, 1, tp * total, scratch);
    for (int i = threadIdx.x; i < V; i += blockDim.x) if (p[i] < v0) p[i] = 0.f;
    __syncthreads();
  }
  if (mp > 0.f) {
    float mx = 0.f;
    for (int i = threadIdx.x; i < V; i += blockDim.x) mx = fmaxf(mx, p[i]);
    mx = block_max(mx, scratch);
    for (int i = threadIdx.x; i < V; i += blockDim.x) if (p[i] < mp * mx) p[i] = 0.f;
    __syncthreads();
  }
  double best = -1.0; int idx = 0x7fffffff;
  for (int i = threadIdx.x; i < V; i += blockDim.x) {
    double r = (double)p[i] / -log(uniform(seed, step, (u64)i));
    if (r > best) { best = r; idx = i; }
  }
  block_argmax_d(best, idx);
  return idx;
}

// True in every thread of the last of `n` blocks to pass (its counter is reset to zero).
__device__ bool last_block(int* counter, int n) {
  __shared__ int last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomicAdd(counter, 1) == n - 1;
    if (last) atomicExch(counter, 0);
  }
  __syncthreads();
  if (last) __threadfence();
  return last;
}

// Multi-block row argmax: grid (blocks, rows), each block `chunk` columns; the last block of a
// row writes out[row] and row_max[row]. part_v/part_i: [rows, blocks] scratch.
extern "C" __global__ void argmax_split_f32(int* out, float* row_max, float* part_v, int* part_i,
                                            int* counters, const float* logits, int V,
                                            int chunk) {
  __shared__ float sv[32];
  __shared__ int si[32];
  int row = blockIdx.y, nb = gridDim.x, lo = blockIdx.x * chunk, hi = min(lo + chunk, V);
  const float* x = logits + (long long)row * V;
  float v = NEG_INF; int idx = 0x7fffffff;
  for (int i = lo + threadIdx.x; i < hi; i += blockDim.x) argmax_pair(v, idx, x[i], i);
  block_argmax(v, idx, sv, si);
  if (threadIdx.x == 0) { part_v[row * nb + blockIdx.x] = v; part_i[row * nb + blockIdx.x] = idx; }
  if (!last_block(counters + row, nb)) return;
  v = NEG_INF; idx = 0x7fffffff;
  for (int b = threadIdx.x; b < nb; b += blockDim.x)
    argmax_pair(v, idx, __ldcg(part_v + row * nb + b), __ldcg(part_i + row * nb + b));
  block_argmax(v, idx, sv, si);
  if (threadIdx.x == 0) { out[row] = idx; if (row_max) row_max[row] = v; }
}

// Multi-block draw after argmax_split_f32 (greedy rows are done). Unfiltered rows race
// exp(x/t - max) / -log(u) over all blocks (the reference's p = e / sum differs only by that
// positive factor); rows with top-k/top-p/min-p run sample_row in their first block.
extern "C" __global__ void sample_split_f32(int* out, float* probs, double* part_v, int* part_i,
                                            int* counters, const float* logits,
                                            const float* row_max, int V, int chunk,
                                            const float* temperature, const int* top_k,
                                            const float* top_p, const float* min_p,
                                            const u64* seeds, const long long* steps) {
  __shared__ float scratch[32];
  int row = blockIdx.y, nb = gridDim.x, k = top_k[row];
  float t = temperature[row];
  if (t <= 1e-5f) return;
  const float* x = logits + (long long)row * V;
  u64 seed = seeds[row], step = (u64)steps[row];
  if ((k > 0 && k < V) || top_p[row] < 1.f || min_p[row] > 0.f) {
    if (blockIdx.x) return;
    int idx = sample_row(probs + (long long)row * V, x, V, t, k, top_p[row], min_p[row], seed,
                         step, scratch);
    if (threadIdx.x == 0) out[row] = idx;
    return;
  }
  float m = row_max[row] / t;
  int lo = blockIdx.x * chunk, hi = min(lo + chunk, V);
  double best = -1.0; int idx = 0x7fffffff;
  for (int i = lo + threadIdx.x; i < hi; i += blockDim.x) {
    double r = (double)expf(x[i] / t - m) / -log(uniform(seed, step, (u64)i));
    if (r > best) { best = r; idx = i; }
  }
  block_argmax_d(best, idx);
  if (threadIdx.x == 0) { part_v[row * nb + blockIdx.x] = best; part_i[row * nb + blockIdx.x] = idx; }
  if (!last_block(counters + row, nb)) return;
  best = -1.0; idx = 0x7fffffff;
  for (int b = threadIdx.x; b < nb; b += blockDim.x) {
    double r = __ldcg(part_v + row * nb + b);
    int j = __ldcg(part_i + row * nb + b);
    if (r > best || (r == best && j < idx)) { best = r; idx = j; }
  }
  block_argmax_d(best, idx);
  if (threadIdx.x == 0) out[row] = idx;
}
