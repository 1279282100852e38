"""Split decode attention with the in-kernel combine, the rope prologue, the fused rope + decode
attention (``rope_cache_attention``) and multi-block sampling against the NumPy references:
batch 1..8, GQA groups 1..8, bf16 and fp8 KV, CUDA graph replay with changing context lengths."""

import numpy as np
import pytest

from atlas_core.api import reference as ref
from atlas_core.api import bfloat16, float8_e4m3fn

from cuda_probe import HAS_GPU, device_rel_error


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HAS_GPU, reason="no CUDA device")]
rng = np.random.default_rng(7)
BS = 16


def rel(be, dev, want):
    return device_rel_error(be, dev, want, check_shape=False)


def rand(*shape, dtype=bfloat16, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(dtype)


def paged(batch, h, kh, d, max_ctx, cache_dtype=bfloat16):
    """Random q, KV cache and block tables wide enough for ``max_ctx`` tokens per sequence."""
    width = -(-max_ctx // BS)
    blocks = batch * width + 4
    kc, vc = rand(blocks, BS, kh, d).astype(cache_dtype), rand(blocks, BS, kh, d).astype(cache_dtype)
    tables = rng.permutation(blocks)[:batch * width].reshape(batch, width).astype(np.int32)
    q = rand(batch, h, d)
    cu = np.arange(batch + 1, dtype=np.int32)
    return q, kc, vc, tables, cu


@pytest.mark.parametrize("h,kh,d", [(32, 8, 128), (32, 4, 128), (16, 2, 256), (8, 8, 64),
                                    (16, 8, 128), (8, 1, 256), (4, 2, 16)])
@pytest.mark.parametrize("batch", [1, 3, 8])
def test_decode_matches_reference(cuda_backend, h, kh, d, batch):
    be = cuda_backend
    q, kc, vc, bt, cu = paged(batch, h, kh, d, 1200)
    sl = rng.integers(1, 1200, batch).astype(np.int32)
    sl[0] = 1
    got = be.ops.paged_attention(*(be.from_host(a) for a in (q, kc, vc, bt, sl, cu)), d ** -0.5)
    assert rel(be, got, ref.paged_attention(q, kc, vc, bt, sl, cu, d ** -0.5)) < 1e-2


@pytest.mark.parametrize("d", [64, 128, 256])
def test_decode_fp8_cache(cuda_backend, d):
    be = cuda_backend
    q, kc, vc, bt, cu = paged(2, 16, 2, d, 700, float8_e4m3fn)
    sl = np.array([700, 33], np.int32)
    got = be.ops.paged_attention(*(be.from_host(a) for a in (q, kc, vc, bt, sl, cu)), d ** -0.5,
                                 kv_scale=0.5)
    want = ref.paged_attention(q, kc, vc, bt, sl, cu, d ** -0.5, kv_scale=0.5)
    assert rel(be, got, want) < 1e-2


@pytest.mark.parametrize("h,kh,d,batch", [(32, 8, 128, 1), (16, 2, 256, 1), (32, 4, 128, 4)])
def test_graph_replay_with_changing_lengths(cuda_backend, h, kh, d, batch):
    be = cuda_backend
    q, kc, vc, bt, cu = paged(batch, h, kh, d, 4096)
    dev = [be.from_host(a) for a in (q, kc, vc, bt)]
    sl = be.from_host(np.ones(batch, np.int32))
    dcu = be.from_host(cu)
    graph = be.capture(lambda: be.ops.paged_attention(*dev, sl, dcu, d ** -0.5))
    for lens in ([1], [17], [130], [4096], [999], [2], [3000]):
        lens = np.resize(np.array(lens, np.int32), batch) - np.arange(batch, dtype=np.int32)
        lens = np.maximum(lens, 1).astype(np.int32)
        be.copy_from_host(sl, lens)
        for _ in range(2):
            graph.replay()
        want = ref.paged_attention(q, kc, vc, bt, lens, cu, d ** -0.5)
        assert rel(be, graph.output, want) < 1e-2, lens


def test_chunked_prefill(cuda_backend):
    be = cuda_backend
    h, kh, d = 16, 4, 128
    _, kc, vc, bt, _ = paged(2, h, kh, d, 600)
    q, sl = rand(5, h, d), np.array([600, 40], np.int32)
    cu = np.array([0, 3, 5], np.int32)
    want = ref.paged_attention(q, kc, vc, bt, sl, cu, d ** -0.5)
    got = be.ops.paged_attention(*(be.from_host(a) for a in (q, kc, vc, bt, sl, cu)), d ** -0.5)
    assert rel(be, got, want) < 1e-2


def test_rope_prologue(cuda_backend):
    be = cuda_backend
    h, kh, d, t = 32, 8, 128, 3
    qkv = rand(t, (h + 2 * kh) * d)
    pos = np.array([5, 130, 4000], np.int32)
    ang = np.arange(4096)[:, None] / (1e6 ** (np.arange(0, d, 2) / d))[None]
    cs = np.concatenate([np.cos(ang), np.sin(ang)], -1).astype(np.float32)
    qn, kn = rand(d, scale=0.1) + 1, rand(d, scale=0.1) + 1
    kc, vc = np.zeros((8, BS, kh, d), bfloat16), np.zeros((8, BS, kh, d), bfloat16)
    slots = np.array([3, 40, 77], np.int32)
    dk, dv = be.from_host(kc), be.from_host(vc)
    got = be.ops.qk_norm_rope_and_cache(be.from_host(qkv), be.from_host(pos), be.from_host(cs),
                                        dk, dv, be.from_host(slots), num_heads=h,
                                        num_kv_heads=kh, head_dim=d, q_norm=be.from_host(qn),
                                        k_norm=be.from_host(kn))
    want = ref.qk_norm_rope_and_cache(qkv, pos, cs, kc, vc, slots, num_heads=h,
                                      num_kv_heads=kh, head_dim=d, q_norm=qn, k_norm=kn)
    assert rel(be, got, want) < 1e-2
    assert rel(be, dk, kc) < 1e-2 and rel(be, dv, vc) < 1e-2


def test_sampling_matches_reference(cuda_backend):
    be, ops = cuda_backend, cuda_backend.ops
    n, vocab = 6, 151936
    logits = rng.standard_normal((n, vocab)).astype(np.float32) * 3
    logits[1, 150000] = 40.0
    logits[2, 7] = logits[2].max() + 1
    dl = be.from_host(logits)
    np.testing.assert_array_equal(be.to_host(ops.argmax(dl)), ref.argmax(logits))
    temp = np.array([0.0, 1.0, 0.7, 1.3, 1.0, 0.5], np.float32)
    top_k = np.array([0, 0, 0, 0, 10, 0], np.int32)
    top_p = np.array([1.0, 1.0, 1.0, 0.9, 1.0, 1.0], np.float32)
    min_p = np.array([0.0, 0.0, 0.0, 0.0, 0.0, 0.05], np.float32)
    seeds = rng.integers(0, 2**63, n).astype(np.uint64)
    for step in (0, 1, 2):
        steps = np.full(n, step, np.int64)
        args = (temp, top_k, top_p, min_p, seeds, steps)
        got = be.to_host(ops.sample(dl, *(be.from_host(a) for a in args)))
        np.testing.assert_array_equal(got, ref.sample(logits, *args))


def rope_case(batch, h, kh, d, max_ctx, cache_dtype=bfloat16, rot=None, norm_dtype=bfloat16):
    """Inputs of ``rope_cache_attention`` for one decode step (the last row padding, slot -1,
    when ``batch > 2``); the caches hold random history."""
    _, kc, vc, bt, cu = paged(batch, h, kh, d, max_ctx, cache_dtype)
    sl = rng.integers(1, max_ctx + 1, batch).astype(np.int32)
    sl[0] = 1
    pos = sl - 1
    slots = (bt[np.arange(batch), pos // BS] * BS + pos % BS).astype(np.int32)
    if batch > 2:
        slots[-1] = -1
    rot = rot or d
    ang = np.arange(max_ctx)[:, None] / (1e6 ** (np.arange(0, rot, 2) / rot))[None]
    cs = np.concatenate([np.cos(ang), np.sin(ang)], -1).astype(np.float32)
    norms = (None, None) if norm_dtype is None else \
        tuple((rand(d, scale=0.1) + 1).astype(norm_dtype) for _ in range(2))
    qkv = rand(batch, (h + 2 * kh) * d, scale=2.0)
    kw = dict(num_heads=h, num_kv_heads=kh, head_dim=d, rotary_dim=rot, q_norm=norms[0],
              k_norm=norms[1])
    return (qkv, pos, cs, kc, vc, slots, bt, sl, cu), kw


def run_rope(be, args, kw, kv_scale=1.0, dev_caches=None, split=False):
    """``rope_cache_attention`` on the device; ``split``: its two-op composition (the rope
    prologue, then decode attention) instead of the fused decode kernel."""
    from atlas_core.api import compose_rope_cache_attention

    qkv, pos, cs, kc, vc, slots, bt, sl, cu = args
    dk, dv = dev_caches or (be.from_host(kc), be.from_host(vc))
    dkw = {k: be.from_host(v) if isinstance(v, np.ndarray) else v for k, v in kw.items()}
    op = (lambda *a, **k: compose_rope_cache_attention(be.ops, *a, **k)) if split \
        else be.ops.rope_cache_attention
    out = op(
        *(be.from_host(a) for a in (qkv, pos, cs)), dk, dv,
        *(be.from_host(a) for a in (slots, bt, sl, cu)), kw["head_dim"] ** -0.5, kv_scale, **dkw)
    return out, dk, dv


@pytest.mark.parametrize("h,kh,d,rot,neox", [
    (32, 8, 128, None, True), (32, 4, 128, None, True), (32, 8, 128, 64, False),
    (16, 2, 256, 64, True), (8, 8, 64, None, True), (8, 2, 64, 32, False), (4, 2, 16, None, True)])
@pytest.mark.parametrize("batch", [1, 3, 8])
@pytest.mark.parametrize("cache", ["bf16", "fp8"])
def test_rope_attention_matches_reference(cuda_backend, h, kh, d, rot, neox, batch, cache):
    if cache == "fp8" and d == 16:
        pytest.skip("fp8 KV needs head_dim >= 64")
    be = cuda_backend
    cache_dtype, kv_scale = (bfloat16, 1.0) if cache == "bf16" else (float8_e4m3fn, 0.5)
    args, kw = rope_case(batch, h, kh, d, 1200, cache_dtype, rot,
                         np.float32 if d in (64, 256) else bfloat16)
    kw["is_neox"] = neox
    want_k, want_v = args[3].copy(), args[4].copy()
    want = ref.rope_cache_attention(*args[:3], want_k, want_v, *args[5:], d ** -0.5, kv_scale,
                                    **kw)
    for split in (False, True):
        got, dk, dv = run_rope(be, args, kw, kv_scale, split=split)
        assert rel(be, got, want) < 2e-2, split
        assert rel(be, dk, want_k) < 2e-2 and rel(be, dv, want_v) < 2e-2, split


def test_rope_attention_graph_replay(cuda_backend):
    """Captured once, replayed over growing contexts: each step writes its new K/V and sees it."""
    be = cuda_backend
    h, kh, d, batch = 32, 4, 128, 2
    args, kw = rope_case(batch, h, kh, d, 4096, norm_dtype=None)
    qkv, pos, cs, kc, vc, slots, bt, sl, cu = args
    dev = {name: be.from_host(a) for name, a in zip(("pos", "slots", "sl"), (pos, slots, sl))}
    dk, dv = be.from_host(kc), be.from_host(vc)
    dq, dcs, dbt, dcu = (be.from_host(a) for a in (qkv, cs, bt, cu))
    graph = be.capture(lambda: be.ops.rope_cache_attention(
        dq, dev["pos"], dcs, dk, dv, dev["slots"], dbt, dev["sl"], dcu, d ** -0.5, **kw))
    ref.rope_cache_attention(*args, d ** -0.5, **kw)  # the capture's eager run wrote its K/V
    for length in (1, 2, 17, 130, 131, 3000):
        lens = np.array([length, max(1, length - 5)], np.int32)
        pos = lens - 1
        slots = (bt[np.arange(batch), pos // BS] * BS + pos % BS).astype(np.int32)
        for name, a in (("pos", pos), ("slots", slots), ("sl", lens)):
            be.copy_from_host(dev[name], a)
        graph.replay()
        want = ref.rope_cache_attention(qkv, pos, cs, kc, vc, slots, bt, lens, cu, d ** -0.5,
                                        **kw)
        assert rel(be, graph.output, want) < 2e-2, length
        assert rel(be, dk, kc) < 1e-2, length
