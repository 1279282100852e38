"""Time ``gated_delta_rule_decode`` on the GPU at qwen3.5-35b-a3b's GDN shapes (16 key / 32
value heads of 128, conv 4, hidden 2048), batch 1 and 8, CUDA-graph replays timed with events:

* ``op``: the decode op alone, over ``LAYERS`` layers' own state pools (so the state comes from
  DRAM, not L2, as in a model); bytes counted: ssm + conv state read and written, qkv, z, out,
  conv weight.
* ``layer``: in_proj (``qkvz`` as one GEMV at batch 1), the ``in_proj_ba`` GEMV, the op and
  out_proj per layer, minus the same chain without the op: what the op costs between the GEMVs.
* ``stacked``: as ``layer`` at batch 1 with ``in_proj_ba`` stacked under ``in_proj_qkvz`` (one
  GEMV of 12352 rows): what folding the ba projection into the big GEMV would save.

Paths: ``unfused`` (ATLAS_CUDA_GDN_FUSED=0: four ops), ``head`` (gdn_conv_gating +
gdn_decode_norm), ``cluster`` (gdn_decode_step).

    python scripts/gdn_decode_paths.py

H200 (working tree at 08177cb + others' edits), us per layer, "GDN part" = chain - GEMVs:
batch 1: op unfused 10.84 / head 8.67 / cluster 9.05; part 15.27 / 10.23 / 11.21; with ba
stacked into in_proj (cluster) 10.26, i.e. the stacked GEMV saves ~0.95 us a layer.
batch 8: op 26.42 / 20.00 / 26.44; part 31.33 / 25.66 / 32.77. Floors 1.07 and 8.44 us.
"""

from __future__ import annotations

import os
from atlas_core.bench.graph_timing import graph_ms

HK, HV, DK, DV, HIDDEN, K, LAYERS = 16, 32, 128, 128, 2048, 4, 8
DIM, VD = 2 * HK * DK + HV * DV, HV * DV
PATHS = {"unfused": ("0", "cluster"), "head": ("1", "head"), "cluster": ("1", "cluster")}


def time_us(be, fn, reps: int = 200) -> float:
    """Median microseconds of ``reps`` event-timed replays of ``fn`` captured as a CUDA graph."""
    return 1e3 * graph_ms(be, fn, reps)


def make_layer(be, n, seed):
    """Weights, state pools (slots 0..n-1 continuing) and metadata of one GDN layer."""
    import numpy as np
    from atlas_core.ops._dtypes import bfloat16
    shapes = {"w_in": (DIM + VD + 2 * HV, HIDDEN), "w_out": (HIDDEN, VD), "conv_w": (DIM, K),
              "norm": (DV,)}
    layer = {name: be.empty(s, bfloat16) for name, s in shapes.items()}
    for i, (name, a) in enumerate(layer.items()):
        be.fill_random(a, seed + i, 0.5 if name == "conv_w" else a.shape[-1] ** -0.5)
    layer["conv"] = be.empty((n, K - 1, DIM), np.float32)
    layer["ssm"] = be.empty((n, HV, DK, DV), np.float32)
    be.fill_random(layer["conv"], seed + 7, 1.0)
    be.fill_random(layer["ssm"], seed + 8, 0.1)
    layer["a_log"] = be.from_host(np.zeros(HV, np.float32))
    layer["dt"] = be.from_host(np.zeros(HV, np.float32))
    layer["meta"] = [be.from_host(a) for a in (np.arange(n + 1, dtype=np.int32),
                                               np.full(n, 9, np.int32),
                                               np.arange(n, dtype=np.int32))]
    return layer


def gdn_op(be, lay, qkv, z, ba):
    return be.ops.gated_delta_rule_decode(
        qkv, z, ba, lay["conv_w"], lay["a_log"], lay["dt"], lay["norm"], lay["conv"], lay["ssm"],
        *lay["meta"], num_k_heads=HK, num_v_heads=HV, head_k_dim=DK, head_v_dim=DV)


def layer_step(be, lay, x, with_op=True, stacked=False):
    """in_proj, ba projection, (op), out_proj: the qwen35 layer's decode GEMVs."""
    ops, n, w = be.ops, x.shape[0], lay["w_in"]
    if n == 1:
        rows = DIM + VD + (2 * HV if stacked else 0)
        row = ops.linear(x, w[:rows]).reshape(rows)
        qkv, z = row[:DIM].reshape(1, DIM), row[DIM:DIM + VD].reshape(1, VD)
    else:
        qkv, z = ops.linear(x, w[:DIM]), ops.linear(x, w[DIM:DIM + VD])
    ba = row[DIM + VD:].reshape(1, 2 * HV) if stacked else ops.linear(x, w[DIM + VD:])
    core = gdn_op(be, lay, qkv, z, ba).reshape(n, VD) if with_op else z
    return ops.linear(core, lay["w_out"])


def main() -> None:
    from atlas_cuda.backend import CudaBackend
    from atlas_core.ops._dtypes import bfloat16
    be = CudaBackend()
    print(f"device {be.device.name}; GDN decode, {LAYERS} layers' own weights and pools")
    print("batch | path | op us/layer | op GB/s | layer chain us | gemvs only us | GDN part us")
    for n in (1, 8):
        layers = [make_layer(be, n, 100 * i) for i in range(LAYERS)]
        x = be.empty((n, HIDDEN), bfloat16)
        be.fill_random(x, 5, 1.0)
        ins = [be.empty((n, DIM), bfloat16), be.empty((n, VD), bfloat16),
               be.empty((n, 2 * HV), bfloat16)]
        for i, a in enumerate(ins):
            be.fill_random(a, 50 + i, 1.0)
        nbytes = (2 * n * (HV * DK * DV + (K - 1) * DIM) * 4 + n * (DIM + 2 * VD) * 2
                  + DIM * K * 2)
        gemvs = time_us(be, lambda: [layer_step(be, lay, x, False) for lay in layers]) / LAYERS
        for path, (fused, kernel) in PATHS.items():
            os.environ["ATLAS_CUDA_GDN_FUSED"], os.environ["ATLAS_CUDA_GDN_DECODE"] = fused, kernel
            be.reset_workspace()
            op = time_us(be, lambda: [gdn_op(be, lay, *ins) for lay in layers]) / LAYERS
            chain = time_us(be, lambda: [layer_step(be, lay, x) for lay in layers]) / LAYERS
            print(f"{n} | {path} | {op:.2f} | {nbytes / op / 1e3:,.0f} | {chain:.2f} | "
                  f"{gemvs:.2f} | {chain - gemvs:.2f}")
            if n == 1 and path == "cluster":
                st = time_us(be, lambda: [layer_step(be, lay, x, stacked=True)
                                          for lay in layers]) / LAYERS
                print(f"{n} | cluster, ba stacked in in_proj | - | - | {st:.2f} | {gemvs:.2f} | "
                      f"{st - gemvs:.2f} (op minus the ba GEMV it saves)")
        print(f"bytes per layer at batch {n}: {nbytes / 1e6:.2f} MB, floor "
              f"{nbytes / 4.2e6:.2f} us at 4.2 TB/s")
        del layers
    for var in ("ATLAS_CUDA_GDN_FUSED", "ATLAS_CUDA_GDN_DECODE"):
        os.environ.pop(var, None)


if __name__ == "__main__":
    main()
