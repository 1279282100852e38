"""Quantized benchmark shapes (``qwen3-8b-fp8``, ``qwen3-8b-nvfp4``, ``qwen3-30b-a3b-fp8``,
``qwen3.5-35b-a3b-nvfp4``): random models keep their projections quantized (filled in place
on the backend), everything else in the model dtype, and the decode floor counts the
quantized bytes."""

from __future__ import annotations

import numpy as np
import pytest

from atlas_core.api import Registry
from atlas_core.backends.numpy_backend import NumpyBackend
from atlas_core.bench.random_model import build_random_model, quant_format
from atlas_core.bench.shapes import FP8_BLOCK, NVFP4, SHAPES, shape_config
from atlas_core.engine.step_timing import StepBytes
from atlas_core.ops.quant import QuantizedWeight, dequantize


def _tiny(quant):
    return {**shape_config("tiny-moe"), "quantization_config": quant}


def _step_bytes(model):
    kv = type("KV", (), {"bytes_per_block": 0, "block_size": 1})()
    return StepBytes(model, kv)(1, 0)


def test_the_issue_shapes_are_registered_with_their_quantization():
    for name, fmt in (("qwen3-8b-fp8", "fp8_block"), ("qwen3-8b-nvfp4", "nvfp4"),
                      ("qwen3-30b-a3b-fp8", "fp8_block"), ("qwen3.5-35b-a3b-nvfp4", "nvfp4")):
        assert quant_format(SHAPES[name])[0] == fmt
        base = {k: v for k, v in SHAPES[name].items() if k != "quantization_config"}
        assert base == SHAPES[name.rsplit("-", 1)[0]]
    assert quant_format(SHAPES["qwen3-8b"]) is None


@pytest.mark.parametrize("quant,fmt", [(FP8_BLOCK, "fp8_block"), (NVFP4, "nvfp4")])
def test_random_model_keeps_projections_and_experts_quantized(quant, fmt):
    model = build_random_model(_tiny(quant), NumpyBackend(), Registry())
    kinds = {}
    for name, module, local, _ in model.named_specs():
        kinds[name] = module.params[local]
    quantized = {n for n, a in kinds.items() if isinstance(a, QuantizedWeight)}
    assert all(kinds[n].format == fmt for n in quantized)
    assert "model.layers.0.self_attn.qkv_proj.weight" in quantized
    assert "model.layers.0.mlp.experts.down_proj" in quantized
    for plain in ("model.embed_tokens.weight", "lm_head.weight", "model.layers.0.mlp.gate.weight"):
        assert plain not in quantized
    w = dequantize(kinds["model.layers.1.self_attn.o_proj.weight"])
    assert np.isfinite(w).all() and 0.5 < w.std() * w.shape[-1] ** 0.5 < 2.0


def test_the_floor_counts_the_quantized_bytes():
    registry = Registry()
    plain = _step_bytes(build_random_model(shape_config("tiny-moe"), NumpyBackend(), registry))
    fp8 = _step_bytes(build_random_model(_tiny(FP8_BLOCK), NumpyBackend(), registry))
    nvfp4 = _step_bytes(build_random_model(_tiny(NVFP4), NumpyBackend(), registry))
    assert nvfp4 < fp8 < plain


def test_a_backend_without_the_format_gets_a_plain_model():
    class NoQuant(NumpyBackend):
        quantized_weight_formats = frozenset()

    model = build_random_model(_tiny(NVFP4), NoQuant(), Registry())
    assert not any(isinstance(m.params[p], QuantizedWeight)
                   for _, m, p, _ in model.named_specs())


def test_a_random_quantized_model_runs_a_forward_on_numpy():
    from atlas_core.engine import EngineArgs, LLMEngine, SamplingParams
    backend = NumpyBackend()
    model = build_random_model(_tiny(NVFP4), backend, Registry())
    engine = LLMEngine(model, backend, EngineArgs(max_num_seqs=2, max_seq_len=64,
                                                  max_prefill_tokens=64,
                                                  enable_prefix_caching=False))
    engine.add_request("r", [1, 2, 3], SamplingParams(max_tokens=3, temperature=0.0,
                                                      ignore_eos=True))
    done = []
    while engine.has_unfinished_requests():
        done += [o for o in engine.step() if o.finished]
    assert len(done[0].outputs[0].token_ids) == 3
