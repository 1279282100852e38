"""Time the Gated DeltaNet decode step on the GPU inside a graph shaped like qwen3.5-35b-a3b's
GDN layers: 30 layers of [input norm + in_proj GEMV, gated_delta_rule_decode, out_proj GEMV],
random bf16 weights, each layer its own state pools (126 MB of state at batch 1 > L2, as in the
model). ``python3 scripts/gdn_decode_paths.py [--batches 1,2,4,8]``.

Paths: ``none`` leaves the GDN op out (out_proj reads z), so ``path - none`` is the op's
in-graph cost per layer (conv + gating kernel and the recurrent-step kernel, PDL overlap
included); ``head`` / ``split[c, t]``: kernel policy ``gdn_decode`` (``c`` columns and ``t``
threads per block); ``head+ba``: the in_proj_ba GEMV separate again (two norm GEMVs, as before
the stacked weight). Bytes of the recurrent step: the state read and written (4 x Hv x Dk x Dv
per sequence) plus q, k, v, z and the output."""

from __future__ import annotations

import argparse
import dataclasses

import numpy as np
from atlas_core.bench.graph_timing import graph_ms

HK, HV, DK, DV, HIDDEN, CONV_K, LAYERS = 16, 32, 128, 128, 2048, 4, 30
HEADS = dict(num_k_heads=HK, num_v_heads=HV, head_k_dim=DK, head_v_dim=DV)
CONV_DIM, VALUE_DIM = 2 * HK * DK + HV * DV, HV * DV
SIZES = [CONV_DIM, VALUE_DIM, 2 * HV]
#: split kernel variants: (columns per block, threads per block)
SPLITS = [(16, 128), (16, 64), (32, 128)]


def _layers(be, slots):
    from atlas_core.ops._dtypes import bfloat16
    layers = []
    for i in range(LAYERS):
        w = {"in": be.empty((sum(SIZES), HIDDEN), bfloat16),
             "out": be.empty((HIDDEN, VALUE_DIM), bfloat16),
             "conv_w": be.empty((CONV_DIM, CONV_K), bfloat16), "norm": be.empty((DV,), bfloat16),
             "in_norm": be.empty((HIDDEN,), bfloat16)}
        for j, a in enumerate(w.values()):
            be.fill_random(a, 100 * i + j + 1, a.shape[-1] ** -0.5)
        w["a_log"] = be.from_host(np.log(np.linspace(1, 16, HV)).astype(np.float32))
        w["dt"] = be.from_host(np.zeros(HV, np.float32))
        w["conv"] = be.from_host(np.zeros((slots, CONV_K - 1, CONV_DIM), np.float32))
        w["ssm"] = be.from_host(np.full((slots, HV, DK, DV), 0.01, np.float32))
        layers.append(w)
    return layers


def _step(be, x, layers, meta, path):
    from atlas_qwen35.projections import norm_project_blocks
    ops, hidden = be.ops, x
    for w in layers:
        if path == "head+ba":
            (qkv, z), res = norm_project_blocks(ops, hidden, None, w["in_norm"], 1e-6, True,
                                                w["in"][:CONV_DIM + VALUE_DIM], SIZES[:2])
            ba, _ = ops.rms_norm_linear(res, None, w["in_norm"], 1e-6,
                                        w["in"][CONV_DIM + VALUE_DIM:], None, True)
        else:
            (qkv, z, ba), _ = norm_project_blocks(ops, hidden, None, w["in_norm"], 1e-6, True,
                                                  w["in"], SIZES)
        if path == "none":
            core = z
        else:
            core = ops.gated_delta_rule_decode(qkv, z, ba, w["conv_w"], w["a_log"], w["dt"],
                                               w["norm"], w["conv"], w["ssm"], *meta, **HEADS)
        hidden = ops.linear(core.reshape(x.shape[0], VALUE_DIM), w["out"])
    return hidden


def _set_path(be, base, path):
    from atlas_qwen35.cuda import gdn_ops
    be.set_policy(dataclasses.replace(
        base, gdn_decode="split" if path.startswith("split") else "head"))
    if path.startswith("split["):
        cols, threads = (int(v) for v in path[6:-1].split(","))
        gdn_ops.SPLIT_COLS, gdn_ops.SPLIT_THREADS = (cols,), threads


def main() -> None:
    from atlas_core.ops._dtypes import bfloat16
    from atlas_core.testing.contracts_ops import rel_error
    from atlas_cuda.backend import CudaBackend
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,2,4,8")
    parser.add_argument("--reps", type=int, default=100)
    args = parser.parse_args()
    be = CudaBackend()
    policy = be.policy
    batches = [int(b) for b in args.batches.split(",")]
    layers = _layers(be, max(batches))
    first = [be.to_host(layers[0][name]) for name in ("conv", "ssm")]
    paths = ["none", "head", "head+ba"] + [f"split[{c},{t}]" for c, t in SPLITS]
    print("batch | path | graph ms | us/layer vs none | recurrent-step GB/s (if it were all)")
    for n in batches:
        x = be.empty((n, HIDDEN), bfloat16)
        be.fill_random(x, 3, 1.0)
        meta = [be.from_host(a) for a in (np.arange(n + 1, dtype=np.int32),
                                          np.full(n, 9, np.int32), np.arange(n, dtype=np.int32))]
        nbytes = n * (4 * HV * DK * DV * 2 + 2 * (CONV_DIM + 3 * VALUE_DIM))
        base, outs = None, {}
        for path in paths:
            _set_path(be, policy, path)
            for name, host in zip(("conv", "ssm"), first):
                be.copy_from_host(layers[0][name], host)
            be.reset_workspace()
            outs[path] = be.to_host(_step(be, x, layers[:1], meta, path)).astype(np.float32)
            be.reset_workspace()
            ms = graph_ms(be, lambda: _step(be, x, layers, meta, path), args.reps)
            base = ms if path == "none" else base
            per = (ms - base) / LAYERS * 1e3
            rate = nbytes / (per * 1e-6) / 1e9 if per > 0 else float("nan")
            print(f"{n} | {path} | {ms:.4f} | {per:.2f} | {rate:,.0f}", flush=True)
        for path in outs:
            if path.startswith("split"):
                print(f"{n} | {path} vs head: rel err of one layer's output "
                      f"{rel_error(outs[path], outs['head']):.2e}")
    be.set_policy(policy)


if __name__ == "__main__":
    main()
