"""Every CUDA op against its NumPy reference on fresh random inputs (bf16 tolerance)."""

import numpy as np
import pytest

from atlas_core.api import reference as ref
from atlas_core.api import bfloat16

pytestmark = pytest.mark.gpu
rng = np.random.default_rng(0)


def rand(*shape, dtype=bfloat16, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(dtype)


def close(be, dev, host, tol=2e-2):
    got = be.to_host(dev).astype(np.float64)
    want = np.asarray(host, dtype=np.float64)
    assert got.shape == want.shape
    assert np.all(np.isfinite(got))
    err = np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-12)
    assert err < tol, err


@pytest.mark.parametrize("m", [1, 3, 8, 17, 100, 300])
@pytest.mark.parametrize("dtype", [bfloat16, np.float16, np.float32])
def test_linear(cuda_backend, m, dtype):
    be = cuda_backend
    x, w, b = rand(m, 264, dtype=dtype), rand(136, 264, dtype=dtype, scale=0.05), rand(136, dtype=dtype)
    close(be, be.ops.linear(be.from_host(x), be.from_host(w), be.from_host(b)), ref.linear(x, w, b))
    close(be, be.ops.linear(be.from_host(x), be.from_host(w)), ref.linear(x, w))


@pytest.mark.parametrize("dtype", [bfloat16, np.float32])
def test_elementwise(cuda_backend, dtype):
    be, ops = cuda_backend, cuda_backend.ops
    x, r, w = rand(5, 256, dtype=dtype), rand(5, 256, dtype=dtype), rand(256, dtype=dtype)
    y, res = ops.rms_norm(be.from_host(x), be.from_host(w), 1e-6, be.from_host(r))
    y_ref, res_ref = ref.rms_norm(x, w, 1e-6, r)
    close(be, y, y_ref)
    close(be, res, res_ref)
    close(be, ops.rms_norm(be.from_host(x), be.from_host(w), 1e-6, zero_centered=True),
          ref.rms_norm(x, w, 1e-6, zero_centered=True))
    close(be, ops.add(be.from_host(x), be.from_host(r)), ref.add(x, r))
    g = rand(3, 512, dtype=dtype)
    close(be, ops.silu_and_mul(be.from_host(g)), ref.silu_and_mul(g))
    close(be, ops.gelu_tanh_and_mul(be.from_host(g)), ref.gelu_tanh_and_mul(g))
    ids = rng.integers(0, 5, 7).astype(np.int32)
    close(be, ops.embedding(be.from_host(ids), be.from_host(x)), ref.embedding(ids, x), 1e-6)
    col = x[:, :1].copy().reshape(5, 1)
    close(be, ops.embedding(be.from_host(ids), be.from_host(col)), ref.embedding(ids, col), 1e-6)
    wide = np.zeros((5, 256), np.float32)
    close(be, ops.add(be.from_host(wide), be.from_host(x)), ref.add(wide, x))


def _paged_setup(seq_lens, nq, h, kh, d, block_size=16, num_blocks=64):
    k_cache = rand(num_blocks, block_size, kh, d)
    v_cache = rand(num_blocks, block_size, kh, d)
    max_blocks = max(-(-s // block_size) for s in seq_lens) + 2
    tables = np.stack([rng.permutation(num_blocks)[:max_blocks] for _ in seq_lens]).astype(np.int32)
    cu = np.concatenate([[0], np.cumsum(nq)]).astype(np.int32)
    q = rand(int(cu[-1]), h, d)
    return q, k_cache, v_cache, tables, np.array(seq_lens, np.int32), cu


@pytest.mark.parametrize("h,kh,d", [(4, 2, 64), (8, 1, 128), (32, 8, 128), (4, 4, 256), (16, 2, 128)])
@pytest.mark.parametrize("case", ["decode", "prefill", "long"])
def test_paged_attention(cuda_backend, h, kh, d, case):
    be = cuda_backend
    seq_lens, nq = {"decode": ([5, 33, 17], [1, 1, 1]), "prefill": ([20, 40], [20, 7]),
                    "long": ([900], [1])}[case]
    q, kc, vc, bt, sl, cu = _paged_setup(seq_lens, nq, h, kh, d, num_blocks=80)
    got = be.ops.paged_attention(*(be.from_host(a) for a in (q, kc, vc, bt, sl, cu)), d ** -0.5)
    close(be, got, ref.paged_attention(q, kc, vc, bt, sl, cu, d ** -0.5))


def test_prefill_attention(cuda_backend):
    be = cuda_backend
    cu = np.array([0, 13, 50], np.int32)
    q, k, v = rand(50, 8, 128), rand(50, 2, 128), rand(50, 2, 128)
    got = be.ops.prefill_attention(be.from_host(q), be.from_host(k), be.from_host(v),
                                   be.from_host(cu), 0.088)
    close(be, got, ref.prefill_attention(q, k, v, cu, 0.088))


@pytest.mark.parametrize("is_neox", [True, False])
def test_rope_and_cache(cuda_backend, is_neox):
    be = cuda_backend
    h, kh, d, t = 4, 2, 64, 6
    cs = ref.rope_cos_sin_cache(d, 128, {"rope_type": "default", "rope_theta": 10000.0})
    pos = rng.integers(0, 128, t).astype(np.int32)
    qkv = rand(t, (h + 2 * kh) * d)
    qn, kn = rand(d), rand(d)
    slots = np.array([3, 7, -1, 20, 21, 40], np.int32)
    kc, vc = rand(4, 16, kh, d), rand(4, 16, kh, d)
    dkc, dvc = be.from_host(kc), be.from_host(vc)
    q = be.ops.qk_norm_rope_and_cache(be.from_host(qkv), be.from_host(pos), be.from_host(cs), dkc,
                                      dvc, be.from_host(slots), num_heads=h, num_kv_heads=kh,
                                      head_dim=d, q_norm=be.from_host(qn), k_norm=be.from_host(kn),
                                      is_neox=is_neox)
    q_ref = ref.qk_norm_rope_and_cache(qkv, pos, cs, kc, vc, slots, num_heads=h, num_kv_heads=kh,
                                       head_dim=d, q_norm=qn, k_norm=kn, is_neox=is_neox)
    close(be, q, q_ref)
    close(be, dkc, kc)
    close(be, dvc, vc)
    qq, kk = rand(t, h, d), rand(t, kh, d)
    gq, gk = be.ops.rotary_embedding(be.from_host(qq), be.from_host(kk), be.from_host(pos),
                                     be.from_host(cs), None, is_neox)
    rq, rk = ref.rotary_embedding(qq, kk, pos, cs, None, is_neox)
    close(be, gq, rq)
    close(be, gk, rk)
    kc2, vc2 = rand(4, 16, kh, d), rand(4, 16, kh, d)
    dk2, dv2 = be.from_host(kc2), be.from_host(vc2)
    be.ops.reshape_and_cache(be.from_host(kk), be.from_host(kk), dk2, dv2, be.from_host(slots))
    ref.reshape_and_cache(kk, kk, kc2, vc2, slots)
    close(be, dk2, kc2)
    close(be, dv2, vc2)


def test_moe(cuda_backend):
    be = cuda_backend
    t, e, k, hidden, inter = 5, 16, 4, 128, 64
    logits = rand(t, e)
    w, ids = be.ops.moe_route(be.from_host(logits), k, True)
    w_ref, ids_ref = ref.moe_route(logits, k, True)
    np.testing.assert_array_equal(be.to_host(ids), ids_ref)
    close(be, w, w_ref, 1e-5)
    x, gu, dn = rand(t, hidden), rand(e, 2 * inter, hidden, scale=0.1), rand(e, hidden, inter, scale=0.1)
    out = be.ops.moe_experts(be.from_host(x), be.from_host(gu), be.from_host(dn), w, ids)
    close(be, out, ref.moe_experts(x, gu, dn, w_ref, ids_ref))


def test_sampling(cuda_backend):
    be, ops = cuda_backend, cuda_backend.ops
    n, vocab = 6, 3000
    logits = rand(n, vocab, dtype=np.float32, scale=3.0)
    dl = be.from_host(logits)
    np.testing.assert_array_equal(be.to_host(ops.argmax(dl)), ref.argmax(logits))
    close(be, ops.log_softmax(dl), ref.log_softmax(logits), 1e-5)
    v, i = ops.topk(dl, 5)
    v_ref, i_ref = ref.topk(logits, 5)
    np.testing.assert_array_equal(be.to_host(i), i_ref)
    prompt = rng.integers(-1, vocab, (n, 9)).astype(np.int32)
    output = rng.integers(-1, vocab, (n, 4)).astype(np.int32)
    rep, pres, freq = (rng.uniform(0.5, 2.0, n).astype(np.float32) for _ in range(3))
    got = ops.apply_penalties(dl, *(be.from_host(a) for a in (prompt, output, rep, pres, freq)))
    close(be, got, ref.apply_penalties(logits, prompt, output, rep, pres, freq), 1e-6)
    temp = np.array([0.0, 1.0, 0.7, 1.3, 1.0, 0.5], np.float32)
    top_k = np.array([0, 0, 50, 0, 10, 0], np.int32)
    top_p = np.array([1.0, 1.0, 1.0, 0.9, 0.8, 1.0], np.float32)
    min_p = np.array([0.0, 0.0, 0.0, 0.0, 0.0, 0.05], np.float32)
    seeds = rng.integers(0, 2**63, n).astype(np.uint64)
    steps = rng.integers(0, 1000, n).astype(np.int64)
    args = (temp, top_k, top_p, min_p, seeds, steps)
    got = be.to_host(ops.sample(dl, *(be.from_host(a) for a in args)))
    np.testing.assert_array_equal(got, ref.sample(logits, *args))


def test_graph_capture_replays(cuda_backend):
    be = cuda_backend
    x = be.from_host(rand(4, 256))
    w = be.from_host(rand(256, 256, scale=0.05))
    graph = be.capture(lambda: be.ops.linear(x, w))
    new = rand(4, 256)
    be.copy_from_host(x, new)
    graph.replay()
    close(be, graph.output, ref.linear(new, be.to_host(w)))
