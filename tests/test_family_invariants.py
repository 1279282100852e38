"""What every model family must do for the engine, checked on each text architecture's tiny
checkpoint on numpy (both broke for Gemma-4 and were found only on an H200 in session 21):

- its forward lets the backend reuse each layer's workspace (the layer scope): gemma-4-31b ran
  out of memory in every bench cell because its model looped over its layers itself, so a
  2,048-token prefill kept every op output of all 60 layers (a recording scope stands in for the
  cuda backend's here);
- every module holding routed experts says its top-k, so the bench floor counts the experts a
  batch can touch (gemma-4-26b-a4b printed 215% of floor).
"""

import numpy as np
import pytest

from atlas_core.plugins import Registry
from atlas_core.testing.checkpoints import write_tiny_checkpoint

REGISTRY = Registry()
#: Text architectures whose tiny checkpoints the loaders write (vision towers and the toy
#: example have their own loops or none).
ARCHITECTURES = [a for a in sorted(REGISTRY.names("weight_loaders"))
                 if a.endswith("ForCausalLM") and a != "ToyForCausalLM"]


class RecordingScope:
    def __init__(self, nbytes):
        self.nbytes, self.carried = nbytes, 0

    def carry(self, *arrays):
        self.carried += 1
        return arrays


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_the_forward_hands_every_layer_to_the_scope(architecture, tmp_path, monkeypatch):
    from atlas_core.engine import SamplingParams
    from atlas_core.llm import LLM

    path = write_tiny_checkpoint(architecture, tmp_path, registry=Registry(), seed=1)
    llm = LLM(str(path), backend="numpy", num_kv_blocks=64, max_num_seqs=2, block_size=8,
              max_prefill_tokens=32)
    backend = llm.engine.backend
    scopes = []

    def layer_scope(nbytes):
        scopes.append(RecordingScope(nbytes))
        return scopes[-1]

    monkeypatch.setattr(backend, "layer_scope", layer_scope, raising=False)
    prompt = np.random.default_rng(0).integers(0, 200, 24).tolist()
    llm.generate([{"prompt_token_ids": prompt}], SamplingParams(max_tokens=2, temperature=0))
    layers = len(llm.engine.model.layers)
    assert scopes, f"{architecture}: the forward never asked the backend for a layer scope"
    assert all(s.carried == layers for s in scopes), \
        f"{architecture}: {[s.carried for s in scopes]} carries for {layers} layers"


#: Overrides that give a family's tiny checkpoint its MoE blocks (Gemma-4 26B-A4B style).
MOE_OVERRIDES = {"Gemma4ForCausalLM": dict(enable_moe_block=True, num_experts=4, top_k_experts=2,
                                           moe_intermediate_size=16)}


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_the_floor_counts_only_the_experts_a_token_touches(architecture, tmp_path):
    """Every module holding routed experts says its top-k, so the bench floor counts the experts
    a batch can touch, not all of them (gemma-4-26b-a4b printed 215% of floor, session 21)."""
    from atlas_core.engine.step_timing import StepBytes
    from atlas_core.llm import LLM

    path = write_tiny_checkpoint(architecture, tmp_path, registry=Registry(), seed=1,
                                 **MOE_OVERRIDES.get(architecture, {}))
    llm = LLM(str(path), backend="numpy", num_kv_blocks=16, max_num_seqs=2, block_size=8,
              max_prefill_tokens=32)
    model = llm.engine.model
    holders = [(name, module) for name, module, local, _ in model.named_specs()
               if ".experts." in f".{local}"]
    missing = sorted({type(m).__name__ for _, m in holders if not hasattr(m, "top_k")})
    assert not missing, f"{architecture}: {missing} hold experts but say no top_k"
    count = StepBytes(model, llm.engine.kv_config)
    assert len(count.experts) == len(holders)
    assert all(k < n for _, n, k in count.experts)
