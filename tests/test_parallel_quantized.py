"""Quantized checkpoints split across ranks: each rank keeps its slices quantized (FP8 block
scales cut on block boundaries, per-channel scales with their rows, NVFP4 packed data and group
scales by groups, global and per-tensor scales replicated), a cut that would fall inside a block
is refused, and two processes give the single-process greedy tokens."""

import types

import numpy as np
import pytest

from atlas_core.model.loader import architecture, create_loader, read_config
from atlas_core.ops.quant import QuantizedWeight, dequantize
from atlas_core.parallel.sharding import ShardingError
from atlas_core.parallel.transform import load_shard
from atlas_core.plugins import Registry
from atlas_core.testing.parallel import assert_parallel_matches
from atlas_core.testing.quant_checkpoints import write_quantized_checkpoint
from atlas_core.weights.checkpoint import Checkpoint

PROMPTS = [[1, 2, 3, 4, 5, 6, 7], [9, 8, 7]]
ARCH = "Qwen3MoeForCausalLM"


@pytest.fixture(scope="module")
def registry():
    return Registry()


def _shard(path, registry, rank, ep=False):
    config = read_config(path)
    loader = create_loader(registry, architecture(config))
    backend = registry.create("gpu_backends", "numpy")
    return load_shard(loader, config, Checkpoint.open(path), backend,
                      types.SimpleNamespace(rank=rank, world_size=2), ep, "float32")


def _param(model, layer, module, name):
    return model.children[f"model.layers.{layer}"].children[module].params[name]


@pytest.mark.parametrize("scheme,fused", [("fp8_block", False), ("fp8_block", True),
                                          ("fp8_channel_ct", False), ("nvfp4_modelopt", True),
                                          ("nvfp4_ct", False)])
def test_each_rank_keeps_its_slices_quantized(tmp_path, registry, scheme, fused):
    q = write_quantized_checkpoint(ARCH, tmp_path / "q", scheme, reference=tmp_path / "ref",
                                   fused_experts=fused, registry=registry)
    rank1 = _shard(q, registry, 1)
    ref = Checkpoint.open(tmp_path / "ref")
    o_proj = _param(rank1, 0, "self_attn", "o_proj.weight")
    assert isinstance(o_proj, QuantizedWeight)
    np.testing.assert_array_equal(dequantize(o_proj),
                                  ref.get("model.layers.0.self_attn.o_proj.weight")[:, 32:])
    qkv = dequantize(_param(rank1, 0, "self_attn", "qkv_proj.weight"))
    np.testing.assert_array_equal(qkv[:32], ref.get("model.layers.0.self_attn.q_proj.weight")[32:])
    down = _param(rank1, 0, "mlp", "experts.down_proj")
    assert isinstance(down, QuantizedWeight) and down.shape == (8, 64, 16)
    ep = _shard(q, registry, 1, ep=True)
    gate_up = _param(ep, 0, "mlp", "experts.gate_up_proj")
    assert isinstance(gate_up, QuantizedWeight) and gate_up.shape == (4, 64, 64)
    name = ("model.layers.0.mlp.experts.gate_up_proj" if fused else
            "model.layers.0.mlp.experts.5.up_proj.weight")
    expected = ref.get(name)[5, 32:] if fused else ref.get(name)
    np.testing.assert_array_equal(dequantize(gate_up)[1, 32:], expected)


def test_a_cut_inside_an_fp8_block_is_refused(tmp_path, registry):
    q = write_quantized_checkpoint(ARCH, tmp_path / "q", "fp8_block", block_size=(32, 32),
                                   registry=registry)
    # a rank's KV head (16 rows) and expert slice (16 rows) are half a 32-row block
    with pytest.raises(ShardingError, match=r"\(32x32 FP8 blocks\): rows/columns 16\.\.32 of "
                                            "32 do not fall on 32-aligned boundaries"):
        _shard(q, registry, 1)


@pytest.mark.parametrize("scheme,ep", [("fp8_block", False), ("fp8_block", True),
                                       ("nvfp4_modelopt", False)])
def test_quantized_checkpoint_matches_single_process(tmp_path, registry, scheme, ep):
    q = write_quantized_checkpoint(ARCH, tmp_path / "q", scheme, registry=registry)
    assert_parallel_matches(q, PROMPTS, tp=2, ep=ep, dtype="float32")
