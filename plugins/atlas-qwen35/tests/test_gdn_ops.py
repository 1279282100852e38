"""Gated DeltaNet op references: chunked == recurrent, and both match HF transformers' torch code.

Tolerance: float32 inputs, max abs error 2e-5 (values are O(1)).
"""

import numpy as np
import pytest

from atlas_core.api import reference as ref
from atlas_qwen35 import gdn_reference as gdn

ATOL = 2e-5
NK, NV, DK, DV, K = 2, 4, 16, 8, 4
LENS = [5, 70, 1, 33]
CONTEXT = [3, 0, 2, 0]          # tokens already seen before this step (0: fresh sequence)
SLOTS = np.array([4, 1, 0, 2], dtype=np.int32)


@pytest.fixture
def batch():
    rng = np.random.default_rng(0)
    total = sum(LENS)
    cu = np.concatenate([[0], np.cumsum(LENS)]).astype(np.int32)
    seq_lens = (np.array(LENS) + np.array(CONTEXT)).astype(np.int32)
    qkv = rng.standard_normal((total, 2 * NK * DK + NV * DV)).astype(np.float32)
    ba = rng.standard_normal((total, 2 * NV)).astype(np.float32)
    a_log = np.log(rng.uniform(0.5, 8, NV)).astype(np.float32)
    dt_bias = rng.standard_normal(NV).astype(np.float32)
    ssm = (rng.standard_normal((6, NV, DK, DV)) * 0.1).astype(np.float32)
    conv = rng.standard_normal((6, K - 1, qkv.shape[1])).astype(np.float32)
    weight = rng.standard_normal((qkv.shape[1], K)).astype(np.float32)
    return dict(cu=cu, seq_lens=seq_lens, qkv=qkv, ba=ba, a_log=a_log, dt_bias=dt_bias, ssm=ssm,
                conv=conv, weight=weight)


def _rule(fn, b, ssm, **kw):
    return fn(b["qkv"], *gdn.gdn_gating(b["ba"], b["a_log"], b["dt_bias"]), ssm, b["cu"],
              b["seq_lens"], SLOTS, num_k_heads=NK, num_v_heads=NV, head_k_dim=DK, head_v_dim=DV, **kw)


def test_chunked_equals_recurrent(batch):
    s_rec, s_chunk = batch["ssm"].copy(), batch["ssm"].copy()
    out_rec = _rule(gdn.gated_delta_rule_recurrent, batch, s_rec)
    out_chunk = _rule(gdn.gated_delta_rule_chunked, batch, s_chunk, chunk_size=16)
    np.testing.assert_allclose(out_chunk, out_rec, atol=ATOL)
    np.testing.assert_allclose(s_chunk, s_rec, atol=ATOL)
    untouched = [i for i in range(6) if i not in SLOTS]
    np.testing.assert_array_equal(s_chunk[untouched], batch["ssm"][untouched])


def test_padding_slot_is_skipped(batch):
    ssm = batch["ssm"].copy()
    slots = np.array([-1, 1, 0, 2], dtype=np.int32)
    g, beta = gdn.gdn_gating(batch["ba"], batch["a_log"], batch["dt_bias"])
    gdn.gated_delta_rule_recurrent(batch["qkv"], g, beta, ssm, batch["cu"], batch["seq_lens"], slots,
                                   num_k_heads=NK, num_v_heads=NV, head_k_dim=DK, head_v_dim=DV)
    np.testing.assert_array_equal(ssm[4], batch["ssm"][4])


def test_sigmoid_mul_and_gated_norm():
    x = np.array([[1.0, -2.0, 3.0]], dtype=np.float32)
    np.testing.assert_allclose(ref.sigmoid_mul(x, np.zeros((1, 1), np.float32)), x / 2)
    z = np.full_like(x, 50.0)
    y = gdn.rms_norm_gated(x, z, np.ones(3, np.float32), 0.0)
    np.testing.assert_allclose(y, x / np.sqrt(np.mean(x * x)) * 50.0, rtol=1e-6)


torch = pytest.importorskip("torch")
hf = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")


def _hf_split(x):
    q, k, v = torch.split(torch.from_numpy(x)[None], [NK * DK, NK * DK, NV * DV], dim=-1)
    return q.reshape(1, -1, NK, DK), k.reshape(1, -1, NK, DK), v.reshape(1, -1, NV, DV)


@pytest.mark.reference
@pytest.mark.parametrize("form", ["chunked", "recurrent"])
def test_delta_rule_matches_hf(batch, form):
    ssm = batch["ssm"].copy()
    fn = gdn.gated_delta_rule_chunked if form == "chunked" else gdn.gated_delta_rule_recurrent
    out = _rule(fn, batch, ssm)
    g, beta = gdn.gdn_gating(batch["ba"], batch["a_log"], batch["dt_bias"])
    a = torch.from_numpy(batch["ba"][:, NV:])
    g_hf = -torch.from_numpy(batch["a_log"]).exp() * torch.nn.functional.softplus(
        a + torch.from_numpy(batch["dt_bias"]))
    np.testing.assert_allclose(g, g_hf.numpy(), atol=ATOL)
    hf_fn = hf.torch_chunk_gated_delta_rule if form == "chunked" else hf.torch_recurrent_gated_delta_rule
    for b, (s, e) in enumerate(zip(batch["cu"][:-1], batch["cu"][1:])):
        init = torch.from_numpy(batch["ssm"][SLOTS[b]])[None] if CONTEXT[b] else None
        o, state = hf_fn(*_hf_split(batch["qkv"][s:e]), g=torch.from_numpy(g[s:e])[None],
                         beta=torch.from_numpy(beta[s:e])[None], initial_state=init,
                         output_final_state=True, use_qk_l2norm_in_kernel=True)
        np.testing.assert_allclose(out[s:e], o[0].numpy(), atol=ATOL)
        np.testing.assert_allclose(ssm[SLOTS[b]], state[0].numpy(), atol=ATOL)


@pytest.mark.reference
def test_conv_matches_hf(batch):
    conv = batch["conv"].copy()
    w = torch.from_numpy(batch["weight"])
    y = gdn.causal_conv1d(batch["qkv"], batch["weight"], None, conv, batch["cu"], batch["seq_lens"], SLOTS)
    for b, (s, e) in enumerate(zip(batch["cu"][:-1], batch["cu"][1:])):
        x = torch.from_numpy(batch["qkv"][s:e]).T[None]
        prev = torch.from_numpy(batch["conv"][SLOTS[b]]).T[None] if CONTEXT[b] else torch.zeros(1, x.shape[1], K - 1)
        full = torch.cat([prev, x], dim=-1)
        y_hf = hf.causal_conv1d_fn(full, w, None, activation="silu")[..., K - 1:]
        np.testing.assert_allclose(y[s:e], y_hf[0].T.numpy(), atol=ATOL)
        np.testing.assert_array_equal(conv[SLOTS[b]], full[0, :, -(K - 1):].T.numpy())


@pytest.mark.reference
def test_conv_update_matches_hf(batch):
    conv = batch["conv"].copy()
    dim = conv.shape[-1]
    x = np.random.default_rng(1).standard_normal((4, dim)).astype(np.float32)
    hf_state = torch.cat([torch.zeros(4, dim, 1), torch.from_numpy(conv[SLOTS].transpose(0, 2, 1).copy())], -1)
    y_hf = hf.causal_conv1d_update(torch.from_numpy(x)[..., None], hf_state,
                                   torch.from_numpy(batch["weight"]), None, "silu")
    y = gdn.causal_conv1d_update(x, batch["weight"], None, conv, np.full(4, 9, np.int32), SLOTS)
    np.testing.assert_allclose(y, y_hf[..., 0].numpy(), atol=ATOL)
    np.testing.assert_array_equal(conv[SLOTS], hf_state[..., 1:].numpy().transpose(0, 2, 1))
