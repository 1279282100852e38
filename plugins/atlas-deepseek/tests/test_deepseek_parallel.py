"""DeepSeek-V3 split over two processes (numpy backend, ``cpu`` comm): multi-head latent
attention by heads (latent projections replicated), the dense MLP, and the grouped-routing MoE
with its shared expert give the single-process greedy tokens, tensor and expert parallel; so
does a variant with a plain ``q_proj`` and no shared expert."""

from __future__ import annotations

import numpy as np
import pytest

from atlas_core.testing.checkpoints import write_tiny_checkpoint
from atlas_core.testing.parallel import assert_parallel_matches

pytestmark = pytest.mark.timeout(180)

ARCH = "DeepseekV3ForCausalLM"
PROMPTS = [np.random.default_rng(s).integers(0, 370, n).tolist() for s, n in ((1, 21), (2, 4))]


@pytest.mark.parametrize("overrides", [{}, {"q_lora_rank": None, "n_shared_experts": 0}],
                         ids=["q_lora_shared", "q_proj_no_shared"])
def test_tensor_and_expert_parallel_match_single_process(registry, tmp_path, overrides):
    tiny = write_tiny_checkpoint(ARCH, tmp_path / "deepseek", registry=registry, **overrides)
    single = assert_parallel_matches(tiny, PROMPTS, tp=2)
    assert_parallel_matches(tiny, PROMPTS, tp=2, ep=True, single=single)
