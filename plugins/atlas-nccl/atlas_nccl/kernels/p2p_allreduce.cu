// One-shot all-reduce of small tensors between the GPUs of one host over peer-mapped memory
// (NVLink or PCIe P2P, buffers shared with CUDA IPC: atlas_nccl/p2p.py). A tensor-parallel decode
// step all-reduces a few KB twice a layer; NCCL's protocols cost ~6-7 us a call at that size even
// replayed from a CUDA graph, most of it synchronisation. Here every rank copies its input into
// its own peer-visible buffer, raises a flag in every peer's buffer, waits for every peer's flag
// and then sums all ranks' copies itself, in rank order, so every rank gets bit-identical sums
// (the ranks of a split model must hold identical activations). Each rank reads world x n
// elements, which only pays for small tensors: large ones stay on NCCL.
//
// Each rank's peer-visible buffer: a header of flags [P2P_MAX_BLOCKS][P2P_MAX_RANKS] (written by
// the peers) and epochs [P2P_MAX_BLOCKS] (this rank's own count of calls per block), then two
// data slots. Block b of call e (its epoch) works on its own slice in slot e & 1 and only waits
// for the peers' block b, so blocks never wait on each other and the epoch lives in device
// memory: a call replayed from a CUDA graph advances it like an eager one. Two slots suffice: a
// peer reaches call e + 2's copy into a slot only after its call e + 1 got this rank's flag,
// which this rank raises after its call e (the last reader of that slot) finished.
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

// data: [nvec] 16-byte vectors, reduced in place. peers: every rank's buffer address as mapped
// in this process (peers[rank] is this rank's own). Grid: up to P2P_MAX_BLOCKS blocks, each a
// contiguous slice of the vectors.
template <typename T>
__device__ void p2p_allreduce_impl(T* data, const unsigned long long* peers, int rank, int world,
                                   long long nvec, long long slot_bytes,
                                   unsigned long long timeout_ns) {
  constexpr int E = 16 / sizeof(T);  // elements a vector
  unsigned char* mine = reinterpret_cast<unsigned char*>(peers[rank]);
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
  long long slot = P2P_HEADER + (long long)(e & 1u) * slot_bytes;
  long long per = (nvec + gridDim.x - 1) / gridDim.x;
  long long v0 = b * per, v1 = min(nvec, v0 + per);
  const uint4* src = reinterpret_cast<const uint4*>(data);
  uint4* own = reinterpret_cast<uint4*>(mine + slot);
  for (long long v = v0 + threadIdx.x; v < v1; v += blockDim.x) own[v] = src[v];
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
  for (long long v = v0 + threadIdx.x; v < v1; v += blockDim.x) {
    float acc[E];
#pragma unroll
    for (int i = 0; i < E; i++) acc[i] = 0.f;
    for (int r = 0; r < world; r++) {
      uint4 x = r == rank ? src[v]
                          : __ldcg(reinterpret_cast<const uint4*>(
                                reinterpret_cast<const unsigned char*>(peers[r]) + slot) + v);
      const T* xs = reinterpret_cast<const T*>(&x);
#pragma unroll
      for (int i = 0; i < E; i++) acc[i] += to_f32(xs[i]);
    }
    uint4 out;
    T* os = reinterpret_cast<T*>(&out);
#pragma unroll
    for (int i = 0; i < E; i++) os[i] = from_f32<T>(acc[i]);
    reinterpret_cast<uint4*>(data)[v] = out;
  }
  if (threadIdx.x == 0) epochs[b] = e;
}

#define P2P_ALLREDUCE(T, S)                                                                    \
  extern "C" __global__ void __launch_bounds__(256) p2p_allreduce_##S(                         \
      T* data, const unsigned long long* peers, int rank, int world, long long nvec,           \
      long long slot_bytes, unsigned long long timeout_ns) {                                   \
    p2p_allreduce_impl<T>(data, peers, rank, world, nvec, slot_bytes, timeout_ns);             \
  }
INSTANTIATE(P2P_ALLREDUCE)
