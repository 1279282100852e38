// The attention prologue of rope_cache.cu (per-head RMSNorm of q / k (/ v), rotary, KV-cache
// write; same arguments and results) for 256- and 512-wide heads with each lane owning D / 32
// consecutive elements of a head in registers: one or two 16-byte loads a lane, the rotary
// partner from the lane half a rotary width away (a shuffle), no shared-memory row. The
// generic kernel walks a head 32 elements at a time through shared memory with scalar loads
// (Gemma-4's rope_qkv_vn: 6.9 us for 32 heads of one token, H200). What does not depend on the
// qkv GEMV is loaded before griddepcontrol.wait: the token's position and slot (host-written),
// its cos / sin and the norm weights (static). Needs rotary_dim a multiple of 2 * D / 32 (the
// host falls back to rope_cache.cu otherwise).
#include "common.cuh"
#include "rope_common.cuh"

template <typename T, typename C, typename N, int D, bool VN>
__device__ void rope_vec_impl(T* q_out, C* k_out, C* v_out, const T* q, const T* k, const T* v,
                              long long q_stride, long long k_stride, long long v_stride,
                              const int* positions, const float* cos_sin, const int* slots,
                              const N* q_norm, const N* k_norm, const N* v_norm, RopeArgs a) {
  constexpr int E = D / 32;  // elements a lane: 8 or 16
  int t = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int nwarps = (blockDim.x >> 5) * gridDim.y, i0 = lane * E;
  int rot = a.rotary_dim, half = rot / 2;
  bool rotated = i0 < rot, first = a.is_neox ? i0 < half : true;
  // neox: the partner of element i0 + e is i0 + e +- half, the same element of the lane half / E
  // away; interleaved: element e ^ 1 of this lane
  int partner = a.is_neox && rotated ? (first ? lane + half / E : lane - half / E) : lane;
  float c[E], s[E], wq[E], wk[E], wv[E];
  const float* cs = cos_sin + (long long)positions[t] * rot;
  long long slot = slots ? slots[t] : t;
#pragma unroll
  for (int e = 0; e < E; e++) {
    int i = i0 + e, j = a.is_neox ? (i < half ? i : i - half) : i / 2;
    c[e] = rotated ? cs[j] : 1.f;
    s[e] = rotated ? cs[half + j] : 0.f;
    wq[e] = q_norm ? to_f32(q_norm[i]) : 1.f;
    wk[e] = k_norm ? to_f32(k_norm[i]) : 1.f;
    wv[e] = VN && v_norm ? to_f32(v_norm[i]) : 1.f;
  }
  pdl_trigger();  // launched with PDL after the qkv GEMV: wait for its output before reading it
  pdl_wait();
  int H = a.num_heads, KH = a.num_kv_heads, total = H + KH + (v ? KH : 0);
  for (int h = blockIdx.y * (blockDim.x >> 5) + warp; h < total; h += nwarps) {
    const T* src;
    C* dst = nullptr;
    T* qdst = nullptr;
    int which;  // 0 q, 1 k, 2 v: picks the norm weights (registers, so no pointer to them)
    bool norm, rotate;
    float scale = 1.f;
    if (h < H) {
      src = q + t * q_stride + (long long)h * D;
      qdst = q_out + ((long long)t * H + h) * D;
      which = 0; norm = q_norm; rotate = true;
    } else {
      if (slot < 0) continue;  // the same for every warp of the token
      int kh = (h - H) % KH;
      bool is_k = h < H + KH;
      src = is_k ? k + t * k_stride + (long long)kh * D : v + t * v_stride + (long long)kh * D;
      dst = (is_k ? k_out : v_out) + (slot * KH + kh) * D;
      which = is_k ? 1 : 2;
      norm = is_k ? (bool)k_norm : VN && v_norm;
      rotate = is_k;
      scale = slots ? a.inv_kv_scale : 1.f;
    }
    float x[E];
#pragma unroll
    for (int b = 0; b < E / 8; b++) {
      Vec8<T> in;
      in.load(src + i0 + 8 * b);
      in.to_float(x + 8 * b);
    }
    if (norm) {
      float ss = 0.f;
#pragma unroll
      for (int e = 0; e < E; e++) ss += x[e] * x[e];
      float inv = rsqrtf(warp_sum(ss) / D + a.eps);
#pragma unroll
      for (int e = 0; e < E; e++) {
        float w = which == 0 ? wq[e] : which == 1 ? wk[e] : wv[e];
        x[e] = to_f32(from_f32<T>(x[e] * inv * w));
      }
    }
    float y[E];
#pragma unroll
    for (int e = 0; e < E; e++) {
      float p = __shfl_sync(0xffffffffu, x[e], partner);  // every lane, rotated or not
      if (!a.is_neox) p = x[e ^ 1];
      bool f = a.is_neox ? first : (e & 1) == 0;
      y[e] = rotate && rotated ? (f ? x[e] * c[e] - p * s[e] : x[e] * c[e] + p * s[e]) : x[e];
      y[e] *= scale;
    }
#pragma unroll
    for (int b = 0; b < E / 8; b++) {
      if (qdst) {
        Vec8<T> o;
        o.from_float(y + 8 * b);
        o.store(qdst + i0 + 8 * b);
      } else {
        Vec8<C> o;
        o.from_float(y + 8 * b);
        o.store(dst + i0 + 8 * b);
      }
    }
  }
}

// rope_vec[_vn][_fp8][_nf32]_d<D>_<dtype>: the arguments of rope_cache.cu's rope_qkv[_vn]...
#define ROPE_VEC_ONE(T, S, C, N, D, VN, NAME)                                                 \
  extern "C" __global__ void NAME##_d##D##_##S(T* qo, C* ko, C* vo, const T* q, const T* k,  \
      const T* v, long long qs, long long ks, long long vs, const int* pos, const float* cs,  \
      const int* slots, const N* qn, const N* kn, const N* vn, int H, int KH, int Dh, int rot, \
      int neox, float eps, float inv) {                                                       \
    RopeArgs a{H, KH, Dh, rot, neox, eps, inv};                                               \
    rope_vec_impl<T, C, N, D, VN>(qo, ko, vo, q, k, v, qs, ks, vs, pos, cs, slots, qn, kn, vn, \
                                  a);                                                         \
  }
#define ROPE_VEC_D(T, S, D)                                                                   \
  ROPE_VEC_ONE(T, S, T, T, D, false, rope_vec) ROPE_VEC_ONE(T, S, T, float, D, false,       \
  rope_vec_nf32) ROPE_VEC_ONE(T, S, fp8, T, D, false, rope_vec_fp8)                          \
  ROPE_VEC_ONE(T, S, fp8, float, D, false, rope_vec_fp8_nf32)                                 \
  ROPE_VEC_ONE(T, S, T, T, D, true, rope_vec_vn) ROPE_VEC_ONE(T, S, T, float, D, true,       \
  rope_vec_vn_nf32) ROPE_VEC_ONE(T, S, fp8, T, D, true, rope_vec_vn_fp8)                     \
  ROPE_VEC_ONE(T, S, fp8, float, D, true, rope_vec_vn_fp8_nf32)
#define ROPE_VEC(T, S) ROPE_VEC_D(T, S, 256) ROPE_VEC_D(T, S, 512)
INSTANTIATE(ROPE_VEC)
