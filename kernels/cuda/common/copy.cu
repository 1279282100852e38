// Many small copies in one launch (CudaBackend.copy_many: a decode step's inputs). The host packs
// a table of segments and the host bytes into one pinned buffer and copies it into `staging` in
// one transfer; a block per segment then moves its bytes to their destination, from the staging
// buffer or from another device array. Destinations do not overlap.
struct CopySeg {
  unsigned long long dst, src;  // device addresses
  unsigned long long nbytes;
};

extern "C" __global__ void copy_segments(const CopySeg* segs) {
  CopySeg s = segs[blockIdx.x];
  unsigned char* dst = reinterpret_cast<unsigned char*>(s.dst);
  const unsigned char* src = reinterpret_cast<const unsigned char*>(s.src);
  unsigned long long n = s.nbytes, head = 0;
  if (((s.dst | s.src) & 15) == 0) {
    head = n & ~15ull;
    for (unsigned long long i = threadIdx.x * 16ull; i < head; i += blockDim.x * 16ull)
      *reinterpret_cast<uint4*>(dst + i) = *reinterpret_cast<const uint4*>(src + i);
  }
  for (unsigned long long i = head + threadIdx.x; i < n; i += blockDim.x) dst[i] = src[i];
}
