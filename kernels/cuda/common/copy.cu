// Byte copies that many small pieces would otherwise make one transfer or launch each.

// `n` bytes from `src` to `dst` by the threads of one block: 16-byte vectors where the two
// addresses share their alignment (leading and trailing bytes one at a time), bytes otherwise.
__device__ __forceinline__ void copy_bytes(unsigned char* dst, const unsigned char* src,
                                           unsigned long long n) {
  const unsigned long long d = reinterpret_cast<unsigned long long>(dst);
  const unsigned long long s = reinterpret_cast<unsigned long long>(src);
  unsigned long long lead = n, body = 0;
  if (((d ^ s) & 15) == 0) {
    lead = (16 - (d & 15)) & 15;
    if (lead > n) lead = n;
    body = (n - lead) & ~15ull;
  }
  for (unsigned long long i = threadIdx.x; i < lead; i += blockDim.x) dst[i] = src[i];
  for (unsigned long long i = lead + threadIdx.x * 16ull; i < lead + body; i += blockDim.x * 16ull)
    *reinterpret_cast<uint4*>(dst + i) = *reinterpret_cast<const uint4*>(src + i);
  for (unsigned long long i = lead + body + threadIdx.x; i < n; i += blockDim.x) dst[i] = src[i];
}

// CudaBackend.copy_many: a decode step's inputs. The host packs a table of segments and the host
// bytes into one pinned buffer and copies it into `staging` in one transfer; a block per segment
// then moves its bytes to their destination, from the staging buffer or from another device
// array. Destinations do not overlap.
struct CopySeg {
  unsigned long long dst, src;  // device addresses
  unsigned long long nbytes;
};

extern "C" __global__ void copy_segments(const CopySeg* segs) {
  const CopySeg s = segs[blockIdx.x];
  copy_bytes(reinterpret_cast<unsigned char*>(s.dst),
             reinterpret_cast<const unsigned char*>(s.src), s.nbytes);
}

// The gather_blocks / scatter_blocks ops (KVBlockIO: KV tier spills and restores). Row x of
// the staging buffer holds entry block_ids[x] of every pool in turn, pool y's bytes at
// pools[y].offset. Grid (rows, pools, parts): block (x, y, z) moves part z of one pool entry
// (parts of 16-byte multiples, so wide recurrent-state rows spread over many blocks). Ids
// outside a pool are skipped.
struct PoolRows {
  unsigned long long base;       // device address of entry 0
  unsigned long long row_bytes;  // bytes of one entry
  unsigned long long offset;     // where the entry's bytes start in a staging row
  unsigned long long num_rows;   // entries in the pool
};

template <bool kGather>
__device__ __forceinline__ void move_block_part(const PoolRows* pools, const int* block_ids,
                                                unsigned char* staging,
                                                unsigned long long staging_row_bytes) {
  const PoolRows p = pools[blockIdx.y];
  const long long id = block_ids[blockIdx.x];
  if (id < 0 || static_cast<unsigned long long>(id) >= p.num_rows) return;
  const unsigned long long part = ((p.row_bytes + gridDim.z - 1) / gridDim.z + 15) & ~15ull;
  const unsigned long long begin = part * blockIdx.z;
  if (begin >= p.row_bytes) return;
  const unsigned long long n = p.row_bytes - begin < part ? p.row_bytes - begin : part;
  unsigned char* row = staging + blockIdx.x * staging_row_bytes + p.offset + begin;
  unsigned char* entry = reinterpret_cast<unsigned char*>(p.base) + id * p.row_bytes + begin;
  if (kGather) {
    copy_bytes(row, entry, n);
  } else {
    copy_bytes(entry, row, n);
  }
}

extern "C" __global__ void gather_blocks(const PoolRows* pools, const int* block_ids,
                                         unsigned char* out, unsigned long long row_bytes) {
  move_block_part<true>(pools, block_ids, out, row_bytes);
}

extern "C" __global__ void scatter_blocks(const PoolRows* pools, const int* block_ids,
                                          unsigned char* rows, unsigned long long row_bytes) {
  move_block_part<false>(pools, block_ids, rows, row_bytes);
}
