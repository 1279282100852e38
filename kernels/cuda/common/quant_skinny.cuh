// Shared by quant_skinny.cu (register ring) and quant_skinny_ring.cu (shared-memory ring):
// the fused RMSNorm prologue's arguments. Include after common.cuh, quant_common.cuh and
// norm_rows.cuh.
#pragma once

// NORM (the qskinny*_norm_* kernels, rms_norm_linear): every block normalises the M <= 8 rows
// of x (+ residual) into shared memory itself after the PDL wait (norm_rows.cuh's two-sweep
// prologue: its one-pass form, with the norm weight preloaded, took the kernels to 124-162
// registers) and reads x from there; block 0 writes the summed residual.
struct QNorm {
  void* r_out;
  const void* residual;
  const void* nw;
  float eps;
  int zc;
};
#define QNORM_ARGS(T) T *r_out, const T *residual, const T *nw, float eps, int zc
