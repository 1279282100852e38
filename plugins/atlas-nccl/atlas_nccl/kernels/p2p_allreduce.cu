// One-shot all-reduce of small tensors between the GPUs of one host over peer-mapped memory
// (NVLink or PCIe P2P, buffers shared with CUDA IPC: atlas_nccl/p2p.py). A tensor-parallel decode
// step all-reduces a few KB twice a layer; NCCL's protocols cost ~6-7 us a call at that size even
// replayed from a CUDA graph, most of it synchronisation. Every rank ends up summing all ranks'
// copies itself, in rank order 0..world-1 with float accumulators, so every rank gets
// bit-identical sums (the ranks of a split model must hold identical activations) and both
// protocols below give the same bits. Each rank moves world x n elements, which only pays for
// small tensors: large ones stay on NCCL.
//
// Two protocols (ATLAS_P2P_ALLREDUCE_MODE, the same on every rank):
//   pull (p2p_allreduce_*): copy the input into this rank's own buffer, raise a flag in every
//     peer's buffer, wait for every peer's flag, then read every peer's copy over the link.
//   push (p2p_allreduce_push_*): write the input into every peer's buffer (region `rank`), raise
//     the flags, wait for every peer's, then sum the regions of this rank's own buffer (local
//     reads; its own part straight from the input). No remote read after the handshake.
// In both, a thread raises peer p's flag with a release store at system scope after a
// __syncthreads, so every thread's data stores of the block (to its own buffer, or to p's) are
// visible to p before the flag (bar.sync orders them before the release, which is cumulative).
//
// Each rank's peer-visible buffer: a header of flags [P2P_MAX_BLOCKS][P2P_MAX_RANKS] (flags[b][r]
// written by rank r) and epochs [P2P_MAX_BLOCKS] (this rank's own count of calls per block),
// then two slots [2][world][P2P_MAX_BLOCKS][region_bytes]: [s][r][b] holds block b's slice from
// rank r (push; pull uses r = 0, its own). Block b of call e (its epoch) works on slot e & 1,
// touches only the [*][*][b] regions and waits only for the peers' block b, so blocks never wait
// on each other and the epoch lives in device memory: a call replayed from a CUDA graph advances
// it like an eager one. A block's region sits at the same place whatever the tensor size, so
// calls of other sizes (other grids: blocks' epochs drift apart) never meet in a region.
//
// Why two slots suffice, in either protocol (even switching between them at one call on every
// rank): block b's accesses to a region in call e are its writes (before the writer's flag e)
// and its reads (after the reader saw every flag e); all come from block b of some rank in call
// e. A rank X touches slot e & 1 again in call e + 2 only after its call e + 1 saw flag e + 1
// of every peer Y, and Y raises that after its pdl_wait in call e + 1, i.e. once its whole
// call-e grid ended, the last of its reads (pull: of X's slot; push: of Y's own slot, which X
// writes) included. So every call-e access to the slot happens before any call-e + 2 access,
// and call e + 1 uses the other slot. Push concretely: peer p writes call e + 1 into my slot
// (e + 1) & 1 while I may still read call e from slot e & 1; it reaches call e + 2's writes
// into slot e & 1 only after my call-e + 1 flag, which I raise after my call-e reads ended.
//
// A third protocol, ll (p2p_allreduce_ll_*, tensors up to LL_MAX_BYTES in p2p.py): no flags
// and no barrier. Each rank writes its slice into every peer's ll area as 16-byte lines that
// carry 8 bytes of data and the call's epoch twice ({data, e, data, e}, one 16-byte store), and
// each reading thread spins on the lines it needs until both epochs in them are e: a 16-byte
// store is seen whole or not at all in each 8-byte half, so a line whose two epochs are e holds
// that call's data. Two slots (e & 1) again; a rank reaches call e + 2 only after reading every
// peer's call-e + 1 lines, which a peer writes after its call-e grid (and its reads) ended.
// Lines from older calls carry older epochs, so no area is ever cleared. Half of every line is
// epochs, which only pays for small tensors (one decode activation).
//
// A peer that never arrives (a dead process) traps after timeout_ns instead of hanging the GPU.
#include "common.cuh"

#define P2P_MAX_RANKS 8
#define P2P_MAX_BLOCKS 64
#define P2P_HEADER 4096  // bytes: flags (2 KiB) + epochs (256 B), rounded up

__device__ __forceinline__ void p2p_store_release(unsigned* p, unsigned v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ unsigned p2p_load_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ unsigned long long p2p_now_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// acc += the E = 16 / sizeof(T) elements of x, in float32 (p2p_allreduce_impl writes these two
// steps out itself: its machine code is the one measured on the GPUs; move it to them once a
// GPU run can check it again).
template <typename T, int E>
__device__ __forceinline__ void p2p_add(float (&acc)[E], uint4 x) {
  const T* xs = reinterpret_cast<const T*>(&x);
#pragma unroll
  for (int i = 0; i < E; i++) acc[i] += to_f32(xs[i]);
}

// dst = the sums rounded once to T (one 16-byte store).
template <typename T, int E>
__device__ __forceinline__ void p2p_store_sum(uint4* dst, const float (&acc)[E]) {
  uint4 out;
  T* os = reinterpret_cast<T*>(&out);
#pragma unroll
  for (int i = 0; i < E; i++) os[i] = from_f32<T>(acc[i]);
  *dst = out;
}

// This block's region from rank r in slot e & 1 of the buffer at base.
__device__ __forceinline__ uint4* p2p_region(unsigned long long base, unsigned e, int r,
                                             int world, long long region_bytes) {
  long long i = ((long long)(e & 1u) * world + r) * P2P_MAX_BLOCKS + blockIdx.x;
  return reinterpret_cast<uint4*>(base + P2P_HEADER + i * region_bytes);
}

// data: [nvec] 16-byte vectors, reduced in place. peers: every rank's buffer address as mapped
// in this process (peers[rank] is this rank's own). Grid: up to P2P_MAX_BLOCKS blocks, each a
// contiguous slice of at most region_bytes / 16 vectors.
template <typename T, bool PUSH>
__device__ void p2p_allreduce_impl(T* data, const unsigned long long* peers, int rank, int world,
                                   long long nvec, long long region_bytes,
                                   unsigned long long timeout_ns) {
  constexpr int E = 16 / sizeof(T);  // elements a vector
  unsigned long long mine = peers[rank];
  unsigned* flags = reinterpret_cast<unsigned*>(mine);
  unsigned* epochs = flags + P2P_MAX_BLOCKS * P2P_MAX_RANKS;
  int b = blockIdx.x;
  __shared__ unsigned s_epoch;
  // Launched with PDL (atlas_nccl/p2p.py): let the next kernel start launching now, so its
  // weight loads (a norm GEMV's) overlap this call's handshake; it still waits for all of this
  // grid before reading what it wrote. Nothing is read before the wait: the input is the
  // previous kernel's output, and so may the epoch be (two all-reduces back to back: the
  // earlier one writes it at its very end, after this one may already have started).
  pdl_trigger();
  pdl_wait();
  if (threadIdx.x == 0) s_epoch = epochs[b] + 1u;
  __syncthreads();
  unsigned e = s_epoch;
  long long per = (nvec + gridDim.x - 1) / gridDim.x;
  if (per * 16 > region_bytes) __trap();  // the host sized the buffer for fewer vectors a block
  long long v0 = b * per, n = min(nvec, v0 + per) - v0;
  const uint4* src = reinterpret_cast<const uint4*>(data) + v0;
  if (PUSH) {
    for (long long v = threadIdx.x; v < n; v += blockDim.x) {
      uint4 x = src[v];
      for (int p = 0; p < world; p++)
        if (p != rank) p2p_region(peers[p], e, rank, world, region_bytes)[v] = x;
    }
  } else {
    uint4* own = p2p_region(mine, e, 0, world, region_bytes);
    for (long long v = threadIdx.x; v < n; v += blockDim.x) own[v] = src[v];
  }
  __syncthreads();  // the whole slice is written before any thread raises the flags
  int p = threadIdx.x;
  if (p < world && p != rank) {
    unsigned* theirs = reinterpret_cast<unsigned*>(peers[p]);
    p2p_store_release(theirs + b * P2P_MAX_RANKS + rank, e);
    const unsigned* flag = flags + b * P2P_MAX_RANKS + p;
    unsigned long long start = p2p_now_ns();
    while ((int)(p2p_load_acquire(flag) - e) < 0) {
      if (p2p_now_ns() - start > timeout_ns) __trap();  // the peer is gone: fail, do not hang
    }
  }
  __syncthreads();  // every peer's slice of this call is in place
  for (long long v = threadIdx.x; v < n; v += blockDim.x) {
    float acc[E];
#pragma unroll
    for (int i = 0; i < E; i++) acc[i] = 0.f;
    for (int r = 0; r < world; r++) {
      const uint4* from = PUSH ? p2p_region(mine, e, r, world, region_bytes)
                               : p2p_region(peers[r], e, 0, world, region_bytes);
      uint4 x = r == rank ? src[v] : __ldcg(from + v);
      const T* xs = reinterpret_cast<const T*>(&x);
#pragma unroll
      for (int i = 0; i < E; i++) acc[i] += to_f32(xs[i]);
    }
    uint4 out;
    T* os = reinterpret_cast<T*>(&out);
#pragma unroll
    for (int i = 0; i < E; i++) os[i] = from_f32<T>(acc[i]);
    reinterpret_cast<uint4*>(data)[v0 + v] = out;
  }
  if (threadIdx.x == 0) epochs[b] = e;
}

__device__ __forceinline__ void p2p_store_line(uint4* p, uint4 v) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y),
               "r"(v.z), "r"(v.w)
               : "memory");
}

__device__ __forceinline__ uint4 p2p_load_line(const uint4* p) {
  uint4 v;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}

// ll: the vectors' 8-byte halves as lines {lo, e, hi, e}. ll_base: the byte offset of the ll
// area in each rank's buffer; ll_region_bytes: one block's lines from one rank in one slot.
template <typename T>
__device__ void p2p_allreduce_ll_impl(T* data, const unsigned long long* peers, int rank,
                                      int world, long long nvec, long long ll_base,
                                      long long ll_region_bytes, unsigned long long timeout_ns) {
  constexpr int E = 16 / sizeof(T);
  unsigned long long mine = peers[rank];
  unsigned* epochs = reinterpret_cast<unsigned*>(mine) + P2P_MAX_BLOCKS * P2P_MAX_RANKS;
  int b = blockIdx.x;
  __shared__ unsigned s_epoch;
  pdl_trigger();  // as p2p_allreduce_impl: nothing is read before the wait
  pdl_wait();
  if (threadIdx.x == 0) s_epoch = epochs[b] + 1u;
  __syncthreads();
  unsigned e = s_epoch;
  long long per = (nvec + gridDim.x - 1) / gridDim.x;
  if (per * 32 > ll_region_bytes) __trap();  // the host sized the area for fewer vectors
  long long v0 = b * per, n = min(nvec, v0 + per) - v0;
  const uint4* src = reinterpret_cast<const uint4*>(data) + v0;
  // lines of block b from rank r in this call's slot of the buffer at base
  auto lines = [&](unsigned long long base, int r) {
    long long i = ((long long)(e & 1u) * world + r) * P2P_MAX_BLOCKS + b;
    return reinterpret_cast<uint4*>(base + ll_base + i * ll_region_bytes);
  };
  for (long long v = threadIdx.x; v < n; v += blockDim.x) {
    uint4 x = src[v];
    uint4 lo = make_uint4(x.x, e, x.y, e), hi = make_uint4(x.z, e, x.w, e);
    for (int p = 0; p < world; p++)
      if (p != rank) {
        uint4* to = lines(peers[p], rank);
        p2p_store_line(to + 2 * v, lo);
        p2p_store_line(to + 2 * v + 1, hi);
      }
  }
  unsigned long long start = 0;
  for (long long v = threadIdx.x; v < n; v += blockDim.x) {
    float acc[E];
#pragma unroll
    for (int i = 0; i < E; i++) acc[i] = 0.f;
    for (int r = 0; r < world; r++) {
      uint4 x;
      if (r == rank) {
        x = src[v];
      } else {
        const uint4* from = lines(mine, r) + 2 * v;
        uint4 lo, hi;
        while (true) {
          lo = p2p_load_line(from);
          hi = p2p_load_line(from + 1);
          if (lo.y == e && lo.w == e && hi.y == e && hi.w == e) break;
          if (!start) start = p2p_now_ns();
          else if (p2p_now_ns() - start > timeout_ns) __trap();  // the peer is gone
        }
        x = make_uint4(lo.x, lo.z, hi.x, hi.z);
      }
      p2p_add<T, E>(acc, x);
    }
    p2p_store_sum<T, E>(reinterpret_cast<uint4*>(data) + v0 + v, acc);
  }
  if (threadIdx.x == 0) epochs[b] = e;
}

#define P2P_ALLREDUCE(T, S)                                                                    \
  extern "C" __global__ void __launch_bounds__(256) p2p_allreduce_##S(                         \
      T* data, const unsigned long long* peers, int rank, int world, long long nvec,           \
      long long region_bytes, unsigned long long timeout_ns) {                                 \
    p2p_allreduce_impl<T, false>(data, peers, rank, world, nvec, region_bytes, timeout_ns);    \
  }                                                                                            \
  extern "C" __global__ void __launch_bounds__(256) p2p_allreduce_push_##S(                    \
      T* data, const unsigned long long* peers, int rank, int world, long long nvec,           \
      long long region_bytes, unsigned long long timeout_ns) {                                 \
    p2p_allreduce_impl<T, true>(data, peers, rank, world, nvec, region_bytes, timeout_ns);     \
  }                                                                                            \
  extern "C" __global__ void __launch_bounds__(256) p2p_allreduce_ll_##S(                      \
      T* data, const unsigned long long* peers, int rank, int world, long long nvec,           \
      long long ll_base, long long ll_region_bytes, unsigned long long timeout_ns) {           \
    p2p_allreduce_ll_impl<T>(data, peers, rank, world, nvec, ll_base, ll_region_bytes,         \
                             timeout_ns);                                                      \
  }
INSTANTIATE(P2P_ALLREDUCE)
