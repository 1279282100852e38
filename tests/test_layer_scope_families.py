"""Every model family's forward lets the backend reuse each layer's workspace (the layer scope):
gemma-4-31b on an H200 ran out of memory in every bench cell because its model looped over its
layers itself and its 2,048-token prefill kept every op output of all 60 layers (session 21).
On the numpy backend (which returns no scope) a recording scope stands in; every family's
tiny checkpoint must ask for one and hand it each layer's outputs."""

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
