"""Mistral-Small-4 split over two processes (numpy backend, ``cpu`` comm): latent attention
by heads with Llama-4 query scaling, the softmax-routed MoE and its shared expert give the
single-process greedy tokens, tensor and expert parallel; so does the text model of a
``Mistral3ForConditionalGeneration`` wrapper (``text_config``, ``model.language_model.*``)."""

from __future__ import annotations

import numpy as np
import pytest

from atlas_core.testing.checkpoints import write_tiny_checkpoint
from atlas_core.testing.parallel import assert_parallel_matches

pytestmark = pytest.mark.timeout(180)

PROMPTS = [np.random.default_rng(s).integers(0, 370, n).tolist() for s, n in ((1, 21), (2, 4))]


@pytest.mark.parametrize("arch", ["Mistral4ForCausalLM", "Mistral3ForConditionalGeneration"])
def test_tensor_and_expert_parallel_match_single_process(arch, registry, tmp_path):
    tiny = write_tiny_checkpoint(arch, tmp_path / "mistral", registry=registry)
    single = assert_parallel_matches(tiny, PROMPTS, tp=2)
    assert_parallel_matches(tiny, PROMPTS, tp=2, ep=True, single=single)
