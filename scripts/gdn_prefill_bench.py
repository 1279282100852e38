"""Time ``gated_delta_rule_chunked`` on the GPU: the token-sequential kernel
(kernel policy ``gdn_prefill=sequential``) against the chunked WY kernels, at Qwen3.5-35B-A3B's
GDN heads (16 key heads, 32 value heads, 128 x 128), one sequence of each length, random inputs.

Also prints the chunked result's relative error against the sequential kernel and, for the
shorter lengths, against the NumPy reference. Bytes counted: qkv read and output written once
(the floor; the chunked kernels also write and read ~600 float32 values per token and head of
scratch)."""

from __future__ import annotations

import argparse
import dataclasses

import numpy as np
from atlas_core.bench.graph_timing import graph_ms

HEADS = dict(num_k_heads=16, num_v_heads=32, head_k_dim=128, head_v_dim=128)


def time_ms(be, fn, reps: int) -> float:
    """Median of ``reps`` event-timed replays of ``fn`` captured as a CUDA graph."""
    return graph_ms(be, fn, reps)


def _inputs(rng, n):
    from atlas_core.ops import reference as ref
    from atlas_core.ops._dtypes import bfloat16
    hk, hv, dk, dv = (HEADS[k] for k in ("num_k_heads", "num_v_heads", "head_k_dim", "head_v_dim"))
    qkv = rng.standard_normal((n, 2 * hk * dk + hv * dv)).astype(bfloat16)
    ba = rng.standard_normal((n, 2 * hv)).astype(np.float32)
    g, beta = ref.gdn_gating(ba, np.log(rng.uniform(1, 16, hv)).astype(np.float32),
                             rng.standard_normal(hv).astype(np.float32))
    return qkv, g, beta


def _run(be, dev, pool):
    qkv, g, beta, cu, seq_lens, slots = dev
    return be.ops.gated_delta_rule_chunked(qkv, g, beta, pool, cu, seq_lens, slots, **HEADS)


def _prep_only(be, dev):
    """Launch gdn_chunk_prep alone (the parallel half of the chunked path)."""
    from atlas_qwen35.cuda import gdn_ops
    qkv, g, beta, cu = dev[:4]
    n, ctx = qkv.shape[0], be.ctx
    scratch = ctx.bind(gdn_ops.GdnOps)._gdn_scratch(n, 32, 128)
    shmem = gdn_ops._PREP_SHMEM
    ctx.launch(ctx.kernel("gdn_chunked", qkv.dtype, "gdn_chunk_prep", shmem),
               (n // gdn_ops.GC_CHUNK + 1, 32), gdn_ops.GC_THREADS, *scratch, qkv, g, beta,
               cu, 1, 16, 32, 128, 128 ** -0.5, 1, shmem=shmem)


def main() -> None:
    from atlas_core.ops import reference as ref
    from atlas_core.testing.contracts_ops import rel_error
    from atlas_cuda.backend import CudaBackend
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="16,64,128,256,512,1024,2048,4096")
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--check-max", type=int, default=1024,
                        help="compare with the NumPy reference up to this length")
    args = parser.parse_args()
    be, rng = CudaBackend(), np.random.default_rng(0)
    policy = be.policy
    print("tokens | sequential ms | chunked ms | speedup | chunked GB/s (floor bytes) | "
          "rel err vs sequential | rel err vs numpy | prep kernel ms")
    for n in (int(x) for x in args.lengths.split(",")):
        qkv, g, beta = _inputs(rng, n)
        host = (qkv, g, beta, np.array([0, n], np.int32), np.array([n], np.int32),
                np.array([0], np.int32))
        dev = [be.from_host(a) for a in host]
        pool = be.zeros((1, 32, 128, 128), np.float32)
        outs, times = {}, {}
        for mode in ("sequential", "chunked"):
            be.set_policy(dataclasses.replace(policy, gdn_prefill=mode))
            be.reset_workspace()
            be.copy_from_host(pool, np.zeros((1, 32, 128, 128), np.float32))
            outs[mode] = be.to_host(_run(be, dev, pool)).astype(np.float32)
            times[mode] = time_ms(be, lambda: _run(be, dev, pool), args.reps)
        prep_ms = time_ms(be, lambda: _prep_only(be, dev), args.reps)
        nbytes = qkv.nbytes + n * 32 * 128 * 2
        err_ref = "-"
        if n <= args.check_max:
            want = ref.gated_delta_rule_chunked(qkv, g, beta, np.zeros((1, 32, 128, 128),
                                                np.float32), *host[3:], **HEADS)
            err_ref = f"{rel_error(outs['chunked'], want):.2e}"
        print(f"{n} | {times['sequential']:.3f} | {times['chunked']:.3f} | "
              f"{times['sequential'] / times['chunked']:.1f}x | "
              f"{nbytes / times['chunked'] / 1e6:,.0f} | "
              f"{rel_error(outs['chunked'], outs['sequential']):.2e} | {err_ref} | {prep_ms:.3f}",
              flush=True)



if __name__ == "__main__":
    main()
