"""The generic decoder loader attaches an MTP head (Qwen3.5's ``mtp.*`` layout) to any
decoder-only family whose config.json declares one and whose checkpoint holds it: tiny random
Llama / Qwen3 checkpoints with a random head keep their greedy output under MTP speculation."""

from __future__ import annotations

import json

import numpy as np
import pytest

from atlas_core.api import Module, SamplingParams, checkpoint_tensors, write_safetensors
from atlas_core.plugins import Registry
from atlas_core.testing.checkpoints import random_tensor, write_tiny_checkpoint
from atlas_core.testing.fake_model import make_engine, run_requests

pytestmark = pytest.mark.timeout(120)

ARCHS = ("LlamaForCausalLM", "Qwen3ForCausalLM")
MTP = {"method": "mtp", "num_speculative_tokens": 2, "draft_token_cost": 0.0}


def write_with_head(arch: str, path, *, declared: bool = True, with_tensors: bool = True):
    registry = Registry()
    if arch not in registry.names("weight_loaders"):
        pytest.skip(f"no loader for {arch} installed")
    write_tiny_checkpoint(arch, path, registry=registry)
    config = json.loads((path / "config.json").read_text())
    if declared:
        config["mtp_num_hidden_layers"] = 1
        (path / "config.json").write_text(json.dumps(config, indent=2))
    if with_tensors:
        loader = registry.create("weight_loaders", arch, registry=registry)
        root = Module()
        root.add("mtp", loader.build_mtp(loader.resolve_config(config), None))
        rng = np.random.default_rng(5)
        tensors = {n: random_tensor(n, s, rng) for n, s in checkpoint_tensors(root).items()}
        write_safetensors(path / "mtp.safetensors", tensors, {"format": "pt"})
    return path


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_output_is_unchanged_with_the_head(arch, tmp_path):
    path = write_with_head(arch, tmp_path / arch)
    rng = np.random.default_rng(7)
    prompts = [rng.integers(0, 370, n).tolist() for n in (9, 3, 17)]
    outs = []
    for spec in (None, MTP):
        engine = make_engine(path, speculative_config=spec)
        assert engine.model.mtp is not None
        params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
        outs.append([o.outputs[0].token_ids for o in run_requests(engine, prompts, params)])
    assert outs[0] == outs[1]
    assert engine.stats().speculative.num_draft_tokens > 0


@pytest.mark.parametrize("declared, with_tensors", [(False, True), (True, False)])
def test_no_head_unless_declared_and_present(declared, with_tensors, tmp_path):
    path = write_with_head("LlamaForCausalLM", tmp_path / "llama", declared=declared,
                           with_tensors=with_tensors)
    assert make_engine(path).model.mtp is None
    with pytest.raises(ValueError, match="MTP head"):
        make_engine(path, speculative_config=MTP)
