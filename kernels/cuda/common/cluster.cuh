// Thread block cluster helpers (sm_90+; on older targets a cluster is one block and these are
// no-ops or local stores). A kernel that exchanges values through distributed shared memory:
//   cluster_arrive(true) at entry (this block runs: members may write its shared memory),
//   cluster_wait() before its first remote store (every member has started),
//   cluster_store_f32(...) into each member, then cluster_arrive(false) + cluster_wait() (every
//   member's stores are in place; no member exits while another may still write to it).
#pragma once
#include "common.cuh"

__device__ __forceinline__ void cluster_arrive(bool relaxed) {
#if __CUDA_ARCH__ >= 900
  if (relaxed) asm volatile("barrier.cluster.arrive.relaxed;\n" ::: "memory");
  else asm volatile("barrier.cluster.arrive;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void cluster_wait() {
#if __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.wait;\n" ::: "memory");
#endif
}

// This block's rank in its cluster and the cluster's block count.
__device__ __forceinline__ void cluster_rank(u32& rank, u32& size) {
  rank = 0;
  size = 1;
#if __CUDA_ARCH__ >= 900
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
  asm volatile("mov.u32 %0, %%cluster_nctarank;\n" : "=r"(size));
#endif
}

// `*p = v` in the shared memory of block `rank` of this cluster.
__device__ __forceinline__ void cluster_store_f32(float* p, u32 rank, float v) {
#if __CUDA_ARCH__ >= 900
  u32 local = (u32)__cvta_generic_to_shared(p), remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(local), "r"(rank));
  asm volatile("st.shared::cluster.f32 [%0], %1;\n" :: "r"(remote), "f"(v) : "memory");
#else
  *p = v;
#endif
}
