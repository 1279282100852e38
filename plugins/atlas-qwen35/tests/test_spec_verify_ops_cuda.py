"""The ops of speculative verify steps replayed from CUDA graphs (issue #27), against the numpy
backend: ``gdn_verify_graph`` (gather/scatter of state rows, inert entries copying the scratch
row onto itself from several staging rows at once, decode op with state index -1) eagerly and
replayed from a CUDA graph with new index buffers, against ``gdn_verify``; and
``rope_cache_attention`` with ``K + 1`` query rows a sequence, padding rows (slot -1) and a
padding sequence, eagerly and from a graph, against the numpy reference on the unpadded layout.
The engine-level checks are in test_spec_verify_graphs_cuda.py.

    python -m pytest -q plugins/atlas-qwen35/tests/test_spec_verify_ops_cuda.py -p no:cacheprovider
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from atlas_core.api import SpecVerifyRows, as_dtype, reference as core_ref, rope_cos_sin_cache
from atlas_core.testing.contracts_ops import make_rng, randn, rel_error

from qwen35_cuda_probe import HAS_GPU

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HAS_GPU, reason="no CUDA device"),
              pytest.mark.timeout(1800)]


# ---------------------------------------------------------------- Gated DeltaNet verify op

#: (num_k_heads, num_v_heads, head_k_dim, head_v_dim): the model's 128 x 128 heads, fewer.
GDN_HEADS = (2, 4, 128, 128)
CONV_K = 4


def _gdn_layer(be, rng, dtype, rows, pools=None):
    hk, hv, dk, dv = GDN_HEADS
    conv_dim = 2 * hk * dk + hv * dv
    params = {"conv1d.weight": randn(rng, (conv_dim, CONV_K), dtype, 0.5),
              "A_log": np.log(rng.uniform(0.5, 4, hv)).astype(np.float32),
              "dt_bias": randn(rng, (hv,)), "norm.weight": randn(rng, (dv,), dtype)}
    if pools is None:
        pools = {"conv": randn(rng, (rows, CONV_K - 1, conv_dim), "float32", 0.5),
                 "ssm": randn(rng, (rows, hv, dk, dv), "float32", 0.1)}
    layer = SimpleNamespace(ops=be.ops, backend=be, eps=1e-6, num_k_heads=hk, num_v_heads=hv,
                            head_k_dim=dk, head_v_dim=dv,
                            params={n: be.from_host(a) for n, a in params.items()},
                            state={n: be.from_host(a) for n, a in pools.items()})
    return layer, params, pools


def _verify_layout(seqs, bucket, width, scratch):
    """Host arrays of a graph verify step as VerifyGraphs._fill_state writes them; ``seqs``:
    per real sequence ``(slot, context before the step, state rows of its positions)``."""
    n = bucket * width
    src, dst = np.full(n, scratch, np.int32), np.full(n, scratch, np.int32)
    state, lens = np.full(n, -1, np.int32), np.ones(n, np.int32)
    for b, (slot, ctx, rows) in enumerate(seqs):
        for j, row in enumerate(rows):
            i = j * bucket + b
            src[i], dst[i] = (slot if j == 0 else rows[j - 1]), row
            state[i], lens[i] = row, ctx + j + 1
    return {"spec_src": src, "spec_dst": dst, "spec_state": state, "spec_lens": lens}


#: Per layout: bucket, width, real sequences ``(slot, context, state rows)`` (the last row of
#: each is its slot, as the speculator plans them; fewer rows than width: padding positions).
GDN_LAYOUTS = {
    "b1-w3-full": (1, 3, [[(0, 9, [4, 5, 0])]]),
    "b2-w3-mixed": (2, 3, [[(1, 20, [4, 1]), (0, 7, [6, 7, 0])]]),
    "b4-w4-padded": (4, 4, [[(0, 30, [4, 5, 6, 0]), (2, 3, [2])],
                            [(1, 12, [7, 8, 1]), (3, 40, [4, 5, 6, 3]), (0, 17, [9, 0])]]),
}


@pytest.mark.parametrize("layout", list(GDN_LAYOUTS))
def test_gdn_verify_graph_replays_match_numpy(cuda_backend, registry, layout):
    """``gdn_verify_graph`` captured over all-inert inputs, then replayed with the index buffers
    of each step of ``layout`` (new qkv / z / ba, fresh pools), against ``gdn_verify`` on the
    numpy backend with the same rows: outputs of real rows and every pool row (the scratch
    row must stay as it was: inert entries copy it onto itself, several at once)."""
    from atlas_qwen35.spec_verify import gdn_verify, gdn_verify_graph
    be, npbe = cuda_backend, registry.create("gpu_backends", "numpy")
    bucket, width, steps = GDN_LAYOUTS[layout]
    rng = make_rng("gdn_verify_graph", layout)
    rows_total = 11
    scratch = rows_total - 1
    layer, params, pools = _gdn_layer(be, rng, "bfloat16", rows_total)
    hk, hv, dk, dv = GDN_HEADS
    conv_dim = 2 * hk * dk + hv * dv
    t = bucket * width
    bf16 = as_dtype("bfloat16")
    dev = {"qkv": be.zeros((t, conv_dim), bf16), "z": be.zeros((t, hv * dv), bf16),
           "ba": be.zeros((t, 2 * hv), bf16)}
    idx = {name: be.from_host(a) for name, a in
           _verify_layout([], bucket, width, scratch).items()}
    views = {n: [idx[n][j * bucket:(j + 1) * bucket] for j in range(width)] for n in idx}
    order = (np.arange(width)[None, :] * bucket + np.arange(bucket)[:, None]).reshape(-1)
    rows_dev = [be.from_host(np.arange(bucket, dtype=np.int32) * width + j)
                for j in range(width)]
    spec = SpecVerifyRows(width=width, rows=rows_dev, src=views["spec_src"],
                          dst=views["spec_dst"], state=views["spec_state"],
                          seq_lens=views["spec_lens"],
                          cu_seqlens=be.from_host(np.arange(bucket + 1, dtype=np.int32)),
                          order=be.from_host(order.astype(np.int32)), scratch={})
    meta = SimpleNamespace(num_tokens=t, num_seqs=bucket, spec_verify=spec)
    holder = {}
    be.synchronize()
    graph = be.capture(lambda: holder.__setitem__(
        "out", gdn_verify_graph(layer, dev["qkv"], dev["z"], dev["ba"], meta)))
    be.synchronize()
    for n, a in pools.items():  # capture ran the inert step twice: nothing may have moved
        got = be.to_host(layer.state[n])
        assert np.array_equal(got, a), f"{layout}: capture over inert inputs changed pool {n}"
    for step, seqs in enumerate(steps):
        qkv = randn(rng, (t, conv_dim), "bfloat16")
        z, ba = randn(rng, (t, hv * dv), "bfloat16"), randn(rng, (t, 2 * hv), "bfloat16")
        fresh = {n: randn(rng, a.shape, "float32", 0.5 if n == "conv" else 0.1)
                 for n, a in pools.items()}
        for n, a in fresh.items():
            be.copy_from_host(layer.state[n], a)
        for n, a in (("qkv", qkv), ("z", z), ("ba", ba)):
            be.copy_from_host(dev[n], a)
        for n, a in _verify_layout(seqs, bucket, width, scratch).items():
            be.copy_from_host(idx[n], a)
        graph.replay()
        out = be.to_host(holder["out"]).astype(np.float32).reshape(bucket, width, -1)
        got_pools = {n: be.to_host(layer.state[n]) for n in fresh}
        # the numpy reference: the eager verify op over the packed real rows
        counts = [len(r) for _, _, r in seqs]
        pick = np.concatenate([np.arange(b * width, b * width + c) for b, c in enumerate(counts)])
        ref_layer, _, _ = _gdn_layer(npbe, make_rng("gdn_verify_graph", layout), "bfloat16",
                                     rows_total, pools={n: a.copy() for n, a in fresh.items()})
        ref_layer.params = {n: npbe.from_host(a) for n, a in params.items()}
        cu = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
        host = {"cu_seqlens_q": cu,
                "seq_lens": np.array([c + n for (_, c, _), n in zip(seqs, counts)], np.int32),
                "state_indices": np.array([s for s, _, _ in seqs], np.int32)}
        ref_meta = SimpleNamespace(num_tokens=int(cu[-1]), num_seqs=len(seqs), host=host,
                                   spec_state_rows=[r for _, _, r in seqs], layer_cache={})
        want = np.asarray(gdn_verify(ref_layer, qkv[pick], z[pick], ba[pick], ref_meta),
                          np.float32).reshape(len(pick), -1)
        for b, c in enumerate(counts):
            err = rel_error(out[b, :c], want[cu[b]:cu[b] + c])
            assert err <= 2e-2, (f"{layout} step {step}: sequence {b} core output of "
                                 f"gdn_verify_graph (graph replay) off by {err:.2e}")
        for n in fresh:
            want_pool = np.asarray(ref_layer.state[n])
            for row in range(rows_total):
                err = rel_error(got_pools[n][row], want_pool[row])
                what = "scratch" if row == scratch else f"row {row}"
                assert err <= 1e-2, (f"{layout} step {step}: pool {n} {what} off by {err:.2e} "
                                     "after the graph replay")


# ---------------------------------------------------------------- attention, K + 1 rows


@pytest.mark.parametrize("width", [2, 3, 4])
@pytest.mark.parametrize("heads", [(8, 2, 128, None), (4, 2, 256, 64)],
                         ids=["d128", "d256-partial-rope"])
def test_rope_cache_attention_verify_rows(cuda_backend, width, heads):
    """``rope_cache_attention`` over a verify step's layout (``width`` rows a sequence, real
    rows first, padding rows at the last real position with slot -1, then an all-padding
    sequence: seq_len ``width``, block table of zeros), eagerly and replayed from a graph,
    against the numpy reference on the unpadded layout: real rows' outputs and the caches
    (padding rows write nothing). At ``width`` 4 and head dim 128 the flash kernel takes it."""
    be = cuda_backend
    num_heads, num_kv_heads, head_dim, rotary = heads
    rng = make_rng("verify_attention", width, heads)
    bs, blocks = 16, 24
    ctx = [37, 5, 16]             # tokens before the step
    real = [width, 1, max(1, width - 1)]  # real query rows of each sequence
    n_real, bucket = len(ctx), len(ctx) + 1
    perm = rng.permutation(blocks - 1) + 1  # block 0 stays the padding rows' dummy
    tables = np.zeros((bucket, 8), np.int32)
    used = 0
    for b, c in enumerate(ctx):
        need = -(-(c + width) // bs)
        tables[b, :need] = perm[used:used + need]
        used += need
    t = bucket * width
    positions, slots = np.zeros(t, np.int32), np.full(t, -1, np.int32)
    for b, (c, k) in enumerate(zip(ctx, real)):
        for j in range(width):
            pos = c + min(j, k - 1)
            positions[b * width + j] = pos
            if j < k:
                slots[b * width + j] = tables[b, pos // bs] * bs + pos % bs
    seq_lens = np.array([c + width for c in ctx] + [width], np.int32)
    cu = (np.arange(bucket + 1) * width).astype(np.int32)
    width_qkv = (num_heads + 2 * num_kv_heads) * head_dim
    qkv = randn(rng, (t, width_qkv), "bfloat16", 2.0)
    k_cache = randn(rng, (blocks, bs, num_kv_heads, head_dim), "bfloat16")
    v_cache = randn(rng, (blocks, bs, num_kv_heads, head_dim), "bfloat16")
    table = rope_cos_sin_cache(rotary or head_dim, 128, {"rope_type": "default",
                                                         "rope_theta": 1e4})
    kw = dict(num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
              rotary_dim=rotary, is_neox=True, eps=1e-6,
              q_norm=randn(rng, (head_dim,), "bfloat16", 0.3) + 1,
              k_norm=randn(rng, (head_dim,), "bfloat16", 0.3) + 1)
    scale = head_dim ** -0.5
    # the reference: the real rows only, as an eager verify step packs them
    pick = np.concatenate([np.arange(b * width, b * width + k) for b, k in enumerate(real)])
    ref_k, ref_v = k_cache.copy(), v_cache.copy()
    want = core_ref.rope_cache_attention(
        qkv[pick], positions[pick], table, ref_k, ref_v, slots[pick], tables[:n_real],
        np.array([c + k for c, k in zip(ctx, real)], np.int32),
        np.concatenate([[0], np.cumsum(real)]).astype(np.int32), scale, 1.0, **kw)
    want = np.asarray(want, np.float32).reshape(len(pick), -1)
    dev = {n: be.from_host(a) for n, a in (("qkv", qkv), ("pos", positions), ("slots", slots),
                                            ("tables", tables), ("lens", seq_lens), ("cu", cu))}
    dk, dv = be.from_host(k_cache), be.from_host(v_cache)
    dkw = {n: (be.from_host(v) if isinstance(v, np.ndarray) else v) for n, v in kw.items()}
    dtable = be.from_host(table)

    def step():
        return be.ops.rope_cache_attention(dev["qkv"], dev["pos"], dtable, dk, dv, dev["slots"],
                                           dev["tables"], dev["lens"], dev["cu"], scale, 1.0,
                                           **dkw)

    be.reset_workspace()
    eager = be.to_host(step()).astype(np.float32).reshape(t, -1)
    holder = {}
    graph = be.capture(lambda: holder.__setitem__("out", step()))
    be.copy_from_host(dk, k_cache)
    be.copy_from_host(dv, v_cache)
    graph.replay()
    replayed = be.to_host(holder["out"]).astype(np.float32).reshape(t, -1)
    for what, got in (("eager", eager), ("graph replay", replayed)):
        err = rel_error(got[pick], want)
        worst = max(range(len(pick)), key=lambda i: rel_error(got[pick[i]], want[i]))
        assert err <= 2e-2, (f"width {width} {heads}: {what} real rows off by {err:.2e} "
                             f"(worst token row {pick[worst]})")
    assert np.array_equal(eager, replayed) or rel_error(replayed, eager) < 1e-6, \
        "the graph replay and the eager call of the same step disagree"
    for label, got, ref in (("k_cache", be.to_host(dk), ref_k), ("v_cache", be.to_host(dv), ref_v)):
        diff = np.flatnonzero(np.any((got.astype(np.float32) - np.asarray(ref, np.float32)
                                      ).reshape(blocks * bs, -1) != 0, axis=1))
        err = rel_error(got.astype(np.float32), np.asarray(ref, np.float32))
        assert err <= 1e-2, (f"width {width} {heads}: {label} off by {err:.2e}; slots that "
                             f"differ: {diff[:12].tolist()} (padding rows write slot -1: none)")
