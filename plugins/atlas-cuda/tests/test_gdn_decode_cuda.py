"""``gated_delta_rule_decode`` through the one-kernel cluster path (``gdn_decode.cu``) against
the NumPy reference: model head shapes (qwen3.5-35b-a3b's 16/32 heads of 128), batches 1..8 with
fresh, continuing and padding sequences, inside a CUDA graph, and beside the two-kernel path.

Tolerances as the contract's delta-rule cases (``RECURRENT_TOL_SCALE``)."""

import numpy as np
import pytest

from atlas_core.ops import reference as ref
from atlas_core.testing.contracts_gdn import RECURRENT_TOL_SCALE
from atlas_core.testing.contracts_ops import assert_close, make_rng, randn

from cuda_probe import HAS_GPU

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HAS_GPU, reason="no CUDA device")]
#: (num_k_heads, num_v_heads, head_k_dim, head_v_dim): qwen3.5-35b-a3b, Qwen3-Next-like with
#: fewer heads, tiny-qwen3.5-moe, more value heads per key head, narrower value columns.
HEADS = [(16, 32, 128, 128), (2, 4, 128, 128), (2, 4, 16, 16), (1, 4, 64, 64), (2, 4, 96, 24)]
K = 4


def _case(rng, dtype, heads, n):
    """Host inputs and pools for ``n`` sequences: continuing, the third fresh (its pool slot
    NaN) and the second a padding row (slot -1)."""
    hk, hv, dk, dv = heads
    dim = 2 * hk * dk + hv * dv
    slots = np.arange(n, dtype=np.int32)[::-1].copy()
    seq_lens = np.array([1 if i == 2 else 2 + (i * 7) % 5 for i in range(n)], np.int32)
    if n > 1:
        slots[1] = -1
    conv = rng.standard_normal((n + 1, K - 1, dim)).astype(np.float32)
    ssm = (rng.standard_normal((n + 1, hv, dk, dv)) * 0.5).astype(np.float32)
    for slot, length in zip(slots, seq_lens):
        if slot >= 0 and length == 1:
            conv[slot], ssm[slot] = np.nan, np.nan
    args = [randn(rng, (n, dim), dtype), randn(rng, (n, hv * dv), dtype),
            randn(rng, (n, 2 * hv), dtype), randn(rng, (dim, K), dtype, 0.5),
            np.log(rng.uniform(0.5, 4, hv)).astype(np.float32), randn(rng, (hv,)),
            randn(rng, (dv,), dtype)]
    meta = [np.arange(n + 1, dtype=np.int32), seq_lens, slots]
    return args, [conv, ssm], meta


def _run(be, args, pools, meta, heads):
    hk, hv, dk, dv = heads
    dev_pools = [be.from_host(p) for p in pools]
    out = be.ops.gated_delta_rule_decode(
        *(be.from_host(a) for a in args), *dev_pools, *(be.from_host(a) for a in meta),
        num_k_heads=hk, num_v_heads=hv, head_k_dim=dk, head_v_dim=dv)
    return be.to_host(out), [be.to_host(p) for p in dev_pools]


def _want(args, pools, meta, heads):
    hk, hv, dk, dv = heads
    pools = [p.copy() for p in pools]
    out = ref.gated_delta_rule_decode(*args, *pools, *meta, num_k_heads=hk, num_v_heads=hv,
                                      head_k_dim=dk, head_v_dim=dv)
    return out, pools


@pytest.fixture
def cluster_calls(cuda_backend, monkeypatch):
    """Counts launches of the cluster kernel (ATLAS_CUDA_GDN_DECODE=cluster)."""
    monkeypatch.setenv("ATLAS_CUDA_GDN_FUSED", "1")
    monkeypatch.setenv("ATLAS_CUDA_GDN_DECODE", "cluster")
    calls = []
    ops = cuda_backend.ops
    real = ops._decode_step_clusters
    monkeypatch.setattr(ops, "_decode_step_clusters",
                        lambda *a, **kw: (calls.append(kw), real(*a, **kw))[1])
    if tuple(cuda_backend.capability) < (9, 0):
        pytest.skip("thread block clusters need sm_90+")
    return calls


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("heads", HEADS)
@pytest.mark.parametrize("n", [1, 3, 8])
def test_cluster_decode_matches_reference(cuda_backend, cluster_calls, dtype, heads, n):
    rng = make_rng("gdn_decode_cluster", dtype, heads, n)
    args, pools, meta = _case(rng, dtype, heads, n)
    out, got_pools = _run(cuda_backend, args, pools, meta, heads)
    want, want_pools = _want(args, pools, meta, heads)
    assert cluster_calls, "the cluster kernel did not run"
    assert_close(out, want, "output", RECURRENT_TOL_SCALE)
    for name, got, host in zip(("conv", "ssm"), got_pools, want_pools):
        assert_close(got, host, f"{name} pool", RECURRENT_TOL_SCALE)


def test_clusters_too_wide_fall_back(cuda_backend, cluster_calls):
    """8 value heads per key head at 128 columns would need clusters of 32: the two kernels."""
    heads = (1, 8, 128, 128)
    args, pools, meta = _case(make_rng("gdn_decode_wide"), "bfloat16", heads, 2)
    out, _ = _run(cuda_backend, args, pools, meta, heads)
    assert not cluster_calls
    assert_close(out, _want(args, pools, meta, heads)[0], "output", RECURRENT_TOL_SCALE)


@pytest.mark.parametrize("n", [1, 8])
def test_cluster_and_head_kernels_agree(cuda_backend, monkeypatch, n):
    heads = (16, 32, 128, 128)
    args, pools, meta = _case(make_rng("gdn_decode_ab", n), "bfloat16", heads, n)
    monkeypatch.setenv("ATLAS_CUDA_GDN_DECODE", "head")
    out_head, pools_head = _run(cuda_backend, args, pools, meta, heads)
    monkeypatch.setenv("ATLAS_CUDA_GDN_DECODE", "cluster")
    out, got_pools = _run(cuda_backend, args, pools, meta, heads)
    assert_close(out, out_head, "output", RECURRENT_TOL_SCALE)
    np.testing.assert_allclose(got_pools[0], pools_head[0], rtol=0, atol=0)
    assert_close(got_pools[1], pools_head[1], "ssm pool")


def test_cluster_decode_in_a_graph(cuda_backend, cluster_calls):
    """Captured once (PDL and cluster launch attributes), replayed on new inputs three times."""
    be, heads, n = cuda_backend, (2, 4, 128, 128), 3
    rng = make_rng("gdn_decode_graph")
    args, pools, meta = _case(rng, "bfloat16", heads, n)
    dev_args = [be.from_host(a) for a in args]
    dev_pools, dev_meta = [be.from_host(p) for p in pools], [be.from_host(a) for a in meta]
    hk, hv, dk, dv = heads
    kwargs = dict(num_k_heads=hk, num_v_heads=hv, head_k_dim=dk, head_v_dim=dv)
    be.reset_workspace()
    graph = be.capture(lambda: be.ops.gated_delta_rule_decode(*dev_args, *dev_pools, *dev_meta,
                                                              **kwargs))
    _, pools = _want(args, pools, meta, heads)  # the eager run inside capture
    seq_lens = meta[1]
    for replay in range(3):
        seq_lens = seq_lens + 1
        be.copy_from_host(dev_meta[1], seq_lens)
        for i in range(3):
            args[i] = randn(rng, args[i].shape, "bfloat16")
            be.copy_from_host(dev_args[i], args[i])
        graph.replay()
        want, pools = _want(args, pools, [meta[0], seq_lens, meta[2]], heads)
        assert_close(be.to_host(graph.output), want, f"replay {replay}", RECURRENT_TOL_SCALE)
    for name, dev, host in zip(("conv", "ssm"), dev_pools, pools):
        assert_close(be.to_host(dev), host, f"{name} pool", RECURRENT_TOL_SCALE)
