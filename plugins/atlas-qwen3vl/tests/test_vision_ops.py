"""The vision-tower ops as this plugin's registered specs: owner, cases on the numpy and mock
backends, and the references against torch (HF's formulas)."""

import numpy as np
import pytest

from atlas_core.api import OpRegistry, Registry, resolve
from atlas_core.testing.contracts_cases import check_case
from atlas_qwen3vl import vision_reference as ref
from atlas_qwen3vl.plugin import OPS
from atlas_qwen3vl.vision_layout import patch_rows_cols, pos_embed_taps, rotary_cos_sin

torch = pytest.importorskip("torch")

NAMES = [spec.name for spec in OPS]


@pytest.fixture(scope="module")
def ops():
    return OpRegistry.load()


def test_specs_come_from_this_plugin(ops):
    for name in NAMES:
        assert ops.owner(name) == "qwen3vl" and ops.spec(name).cases is not None
        assert ops.reference(name) is getattr(ref, name)


@pytest.mark.parametrize("backend_name", ["numpy", "mock"])
def test_cases_on_builtin_backends(ops, backend_name):
    backend = Registry().create("gpu_backends", backend_name)
    try:
        for name in NAMES:
            for case in resolve(ops.spec(name).cases)():
                check_case(backend, ops, name, case)
    finally:
        backend.close()


def test_layer_norm_and_gelu_match_torch():
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((5, 24)) * 3 + 1).astype(np.float32)
    w, b = rng.standard_normal(24).astype(np.float32), rng.standard_normal(24).astype(np.float32)
    want = torch.nn.functional.layer_norm(torch.tensor(x), (24,), torch.tensor(w), torch.tensor(b),
                                          1e-6).numpy()
    assert np.abs(ref.layer_norm(x, w, b, 1e-6) - want).max() < 1e-5
    for approximate in ("none", "tanh"):
        want = torch.nn.functional.gelu(torch.tensor(x), approximate=approximate).numpy()
        assert np.abs(ref.gelu(x, approximate) - want).max() < 1e-5
    with pytest.raises(ValueError, match="approximate"):
        ref.gelu(x, "fast")


@pytest.mark.parametrize("query_block", [512, 5])
def test_vision_attention_is_bidirectional_per_image(monkeypatch, query_block):
    from transformers.models.qwen3_vl.modeling_qwen3_vl import apply_rotary_pos_emb_vision

    monkeypatch.setattr(ref, "QUERY_BLOCK", query_block)
    rng = np.random.default_rng(1)
    grids = [(1, 4, 4), (1, 2, 4)]
    heads, dim = 2, 8
    qkv = rng.standard_normal((24, 3 * heads * dim)).astype(np.float32)
    table = rotary_cos_sin(grids, dim, 2, 10000.0)
    out = ref.vision_attention(qkv, table, np.array([0, 16, 24], np.int32), dim ** -0.5,
                               num_heads=heads, head_dim=dim)
    q, k, v = torch.tensor(qkv).reshape(24, 3, heads, dim).unbind(1)
    cos = torch.tensor(np.concatenate([table[:, :dim // 2]] * 2, -1))
    sin = torch.tensor(np.concatenate([table[:, dim // 2:]] * 2, -1))
    q, k = apply_rotary_pos_emb_vision(q, k, cos, sin)
    want = []
    for s, e in ((0, 16), (16, 24)):
        att = torch.nn.functional.scaled_dot_product_attention(
            q[s:e].transpose(0, 1), k[s:e].transpose(0, 1), v[s:e].transpose(0, 1))
        want.append(att.transpose(0, 1).reshape(e - s, heads * dim))
    assert np.abs(out - torch.cat(want).numpy()).max() < 1e-5


def test_layout_matches_hf_helpers():
    from transformers.vision_utils import (get_vision_interpolation_indices_and_weights,
                                           get_vision_position_ids)

    grids = [(1, 6, 4), (2, 2, 2)]
    rows, cols = patch_rows_cols(grids, 2)
    want = get_vision_position_ids(torch.tensor(grids), 2).numpy()
    assert (np.stack([rows, cols], 1) == want).all()
    indices, weights = pos_embed_taps(grids, 4, 2)
    hi, hw = get_vision_interpolation_indices_and_weights(
        torch.tensor(grids), num_grid_per_side=4, mode="bilinear", align_corners=True,
        spatial_merge_size=2)
    assert (indices == hi.numpy()).all() and np.abs(weights - hw.numpy()).max() < 1e-6
