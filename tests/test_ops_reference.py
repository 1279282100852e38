"""The NumPy references checked against independent formulations (and HF rope where available)."""

from __future__ import annotations

import numpy as np
import pytest

from atlas_core.ops import reference as ref
from atlas_core.ops._dtypes import float8_e4m3fn
from atlas_core.ops.rotary import rope_cos_sin_cache, rope_parameters
from atlas_core.ops.sampling import random_uniform

rng = np.random.default_rng(1234)


def _naive_attention(q, k, v, q_pos, scale):
    # One query, one head at a time: softmax over keys 0..q_pos.
    num_heads, num_kv_heads = q.shape[1], k.shape[1]
    out = np.zeros(q.shape, np.float64)
    for i in range(q.shape[0]):
        for h in range(num_heads):
            kh = h // (num_heads // num_kv_heads)
            s = np.array([q[i, h] @ k[j, kh] * scale for j in range(q_pos[i] + 1)])
            p = np.exp(s - s.max())
            out[i, h] = (p / p.sum()) @ v[:q_pos[i] + 1, kh]
    return out


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("num_heads,num_kv_heads", [(4, 4), (4, 1), (8, 2)])
def test_prefill_attention_matches_naive_loop(num_heads, num_kv_heads, causal):
    lens = [3, 18]
    cu = np.array([0, 3, 21], np.int32)
    q, k, v = (rng.standard_normal((21, h, 16)).astype(np.float32)
               for h in (num_heads, num_kv_heads, num_kv_heads))
    out = ref.prefill_attention(q, k, v, cu, 0.25, causal=causal)
    for b, n in enumerate(lens):
        s = slice(cu[b], cu[b + 1])
        q_pos = np.arange(n) if causal else np.full(n, n - 1)  # bidirectional: every key
        np.testing.assert_allclose(out[s], _naive_attention(q[s], k[s], v[s], q_pos, 0.25),
                                   rtol=1e-5, atol=1e-5)


def test_paged_attention_equals_prefill_on_contiguous_blocks():
    block_size, lens = 16, [17, 40]
    cu = np.array([0, 17, 57], np.int32)
    q, k, v = (rng.standard_normal((57, h, 32)).astype(np.float32) for h in (4, 2, 2))
    k_cache = np.zeros((8, block_size, 2, 32), np.float32)
    v_cache = np.zeros_like(k_cache)
    tables = np.array([[0, 1, 7, 7], [2, 3, 4, 7]], np.int32)
    slots = np.concatenate([np.arange(17), 32 + np.arange(40)]).astype(np.int32)
    ref.reshape_and_cache(k, v, k_cache, v_cache, slots)
    paged = ref.paged_attention(q, k_cache, v_cache, tables, np.array(lens, np.int32), cu, 0.2)
    np.testing.assert_allclose(paged, ref.prefill_attention(q, k, v, cu, 0.2), rtol=1e-5, atol=1e-6)
    # Decode of the last token and a two-chunk prefill see the same context.
    last = np.array([16, 56])
    decode = ref.paged_attention(q[last], k_cache, v_cache, tables, np.array(lens, np.int32),
                                 np.array([0, 1, 2], np.int32), 0.2)
    np.testing.assert_allclose(decode, paged[last], rtol=1e-5, atol=1e-6)
    chunk = ref.paged_attention(q[17 + 25:], k_cache, v_cache, tables[1:], np.array([40], np.int32),
                                np.array([0, 15], np.int32), 0.2)
    np.testing.assert_allclose(chunk, paged[17 + 25:], rtol=1e-5, atol=1e-6)


def test_fp8_cache_roundtrip_uses_kv_scale():
    k = np.array([[[1.0, -3.0, 96.0, 0.015625]]], np.float32)  # exact in e4m3 after / 2
    k_cache = np.zeros((1, 4, 1, 4), float8_e4m3fn)
    v_cache = np.zeros_like(k_cache)
    ref.reshape_and_cache(k, k, k_cache, v_cache, np.array([2], np.int32), kv_scale=2.0)
    np.testing.assert_array_equal(k_cache[0, 2].astype(np.float32), k[0] / 2)
    np.testing.assert_array_equal(ref.gather_kv(k_cache, np.array([0]), 3, kv_scale=2.0)[2], k[0])


def test_rotary_neox_equals_complex_rotation():
    dim, pos = 8, np.array([0, 3, 250], np.int32)
    table = rope_cos_sin_cache(dim, 256, {"rope_type": "default", "rope_theta": 10000.0})
    q = rng.standard_normal((3, 2, dim)).astype(np.float32)
    out, _ = ref.rotary_embedding(q, q[:, :1], pos, table, is_neox=True)
    inv_freq = 1.0 / 10000.0 ** (np.arange(0, dim, 2) / dim)
    z = (q[..., :dim // 2] + 1j * q[..., dim // 2:]) * np.exp(1j * pos[:, None, None] * inv_freq)
    np.testing.assert_allclose(out, np.concatenate([z.real, z.imag], -1), rtol=1e-4, atol=1e-4)
    gptj, _ = ref.rotary_embedding(q, q[:, :1], pos, table, is_neox=False)
    zj = (q[..., 0::2] + 1j * q[..., 1::2]) * np.exp(1j * pos[:, None, None] * inv_freq)
    np.testing.assert_allclose(gptj[..., 0::2], zj.real, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(gptj[..., 1::2], zj.imag, rtol=1e-4, atol=1e-4)


def test_partial_rotary_passes_tail_through():
    table = rope_cos_sin_cache(16, 64, {"rope_type": "default", "rope_theta": 1e4})
    q = rng.standard_normal((2, 1, 64)).astype(np.float32)
    out, _ = ref.rotary_embedding(q, q, np.array([5, 9], np.int32), table, rotary_dim=16)
    np.testing.assert_array_equal(out[..., 16:], q[..., 16:])


def test_moe_experts_matches_dense_loop():
    tokens, experts, hidden, inter, top_k = 6, 5, 16, 12, 2
    x = rng.standard_normal((tokens, hidden)).astype(np.float32)
    w1 = rng.standard_normal((experts, 2 * inter, hidden)).astype(np.float32) * 0.3
    w2 = rng.standard_normal((experts, hidden, inter)).astype(np.float32) * 0.3
    weights, ids = ref.moe_route(rng.standard_normal((tokens, experts)), top_k, True)
    want = np.zeros_like(x)
    for t in range(tokens):
        for j in range(top_k):
            gate_up = w1[ids[t, j]] @ x[t]
            h = gate_up[:inter] / (1 + np.exp(-gate_up[:inter])) * gate_up[inter:]
            want[t] += weights[t, j] * (w2[ids[t, j]] @ h)
    np.testing.assert_allclose(ref.moe_experts(x, w1, w2, weights, ids), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-6)


def test_moe_experts_adds_every_choice_of_a_repeated_expert():
    """Expert parallelism remaps other ranks' choices to local expert 0 with weight 0, so a
    token may name expert 0 twice: the live choice must not be lost to the zero one (fancy-index
    ``+=`` keeps only the last write of a repeated row), and the numpy backend agrees."""
    from atlas_core.api import Registry
    tokens, experts, hidden, inter = 3, 4, 8, 6
    x = rng.standard_normal((tokens, hidden)).astype(np.float32)
    w1 = rng.standard_normal((experts, 2 * inter, hidden)).astype(np.float32) * 0.3
    w2 = rng.standard_normal((experts, hidden, inter)).astype(np.float32) * 0.3
    ids = np.array([[0, 0, 2], [0, 1, 0], [3, 0, 0]], np.int32)
    weights = np.array([[0.7, 0.0, 0.3], [0.0, 0.5, 0.5], [1.0, 0.0, 0.0]], np.float32)
    live = ids.copy()
    live[weights == 0] = -1
    want = np.zeros_like(x)
    for t in range(tokens):
        for j in range(3):
            if live[t, j] >= 0:
                gate_up = w1[ids[t, j]] @ x[t]
                h = gate_up[:inter] / (1 + np.exp(-gate_up[:inter])) * gate_up[inter:]
                want[t] += weights[t, j] * (w2[ids[t, j]] @ h)
    np.testing.assert_allclose(ref.moe_experts(x, w1, w2, weights, ids), want, rtol=1e-5, atol=1e-5)
    ops = Registry().create("gpu_backends", "numpy").ops
    np.testing.assert_allclose(ops.moe_experts(x, w1, w2, weights, ids), want, rtol=1e-5,
                               atol=1e-5)


def test_moe_route_ties_prefer_lower_expert():
    weights, ids = ref.moe_route(np.array([[1.0, 3.0, 3.0, 0.0]], np.float32), 2, False)
    np.testing.assert_array_equal(ids, [[1, 2]])


def test_apply_penalties_by_hand():
    logits = np.array([[1.0, -1.0, 2.0, 0.0, 3.0]], np.float32)
    out = ref.apply_penalties(logits, np.array([[4, -1]], np.int32), np.array([[2, 2, 1, -1]], np.int32),
                              np.array([1.5], np.float32), np.array([0.1], np.float32),
                              np.array([0.2], np.float32))
    # 4: prompt -> 3/1.5; 2: twice -> 2/1.5 - 0.4 - 0.1; 1: once -> -1*1.5 - 0.2 - 0.1
    np.testing.assert_allclose(out, [[1.0, -1.8, 2 / 1.5 - 0.5, 0.0, 2.0]], rtol=1e-6)


def test_random_uniform_is_uniform_and_counter_based():
    u = random_uniform(7, 3, 20000)
    assert 0 < u.min() and u.max() < 1 and abs(u.mean() - 0.5) < 0.01
    np.testing.assert_array_equal(random_uniform(7, 3, 50), u[:50])
    assert not np.array_equal(random_uniform(7, 4, 50), u[:50])


torch = pytest.importorskip("torch")
llama = pytest.importorskip("transformers.models.llama.modeling_llama")

ROPE_CONFIGS = {
    "default": {"rope_type": "default", "rope_theta": 10000.0},
    "linear": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
    "llama3": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 1024},
    "yarn": {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0,
             "original_max_position_embeddings": 1024},
    "yarn_mscale": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 40.0, "mscale": 1.0,
                    "mscale_all_dim": 0.707, "beta_fast": 32, "beta_slow": 1,
                    "original_max_position_embeddings": 512},
}


@pytest.mark.reference
@pytest.mark.parametrize("name", sorted(ROPE_CONFIGS))
def test_rope_tables_match_transformers(name):
    head_dim, max_pos = 64, 4096
    config = llama.LlamaConfig(hidden_size=256, num_attention_heads=4, head_dim=head_dim,
                               max_position_embeddings=max_pos,
                               rope_parameters=dict(ROPE_CONFIGS[name]))
    rotary = llama.LlamaRotaryEmbedding(config)
    positions = torch.tensor([[0, 1, 17, 1000, 4095]])
    cos, sin = rotary(torch.zeros(1, 5, head_dim), positions)
    params = rope_parameters({"rope_parameters": dict(ROPE_CONFIGS[name])})
    table = rope_cos_sin_cache(head_dim, max_pos, params, max_pos)[positions[0].numpy()]
    half = head_dim // 2
    # Both sides round the angle position * inv_freq to float32, in their own order
    # (transformers 5.24 differs from earlier releases): at position p they may differ by a few
    # ulps of an angle up to p rad, p * 2^-22 (1e-3 at 4,095). A wrong frequency or scaling is
    # off by far more; position 0-17 rows stay within 2e-5.
    tol = 2e-5 + positions[0].numpy()[:, None] * 2.0 ** -22
    for ours, theirs in ((table[:, :half], cos[0, :, :half]), (table[:, half:], sin[0, :, :half])):
        diff = np.abs(ours - theirs.numpy())
        assert (diff <= tol).all(), f"max excess {(diff - tol).max():.3g} at {np.argmax(diff - tol)}"
