"""Qwen3.5 / Qwen3-Next split over two processes (numpy backend, ``cpu`` comm): the shared
expert (tensor parallel: a slice per rank; expert parallel: the same, next to each rank's
experts), Gated DeltaNet heads and gated attention give the single-process greedy tokens."""

from __future__ import annotations

import numpy as np
import pytest

from atlas_core.testing.checkpoints import write_tiny_checkpoint
from atlas_core.testing.parallel import assert_parallel_matches

pytestmark = pytest.mark.timeout(180)

PROMPTS = [np.random.default_rng(s).integers(0, 370, n).tolist() for s, n in ((1, 9), (2, 4))]


@pytest.fixture(scope="module")
def attention_moe(registry, tmp_path_factory):
    """Qwen3.5-MoE with full attention on every layer: shared experts without recurrent state."""
    return write_tiny_checkpoint("Qwen3_5MoeForCausalLM", tmp_path_factory.mktemp("moe"),
                                 registry=registry, layer_types=["full_attention"] * 4)


@pytest.mark.parametrize("ep", [False, True], ids=["tp2", "ep2"])
def test_shared_expert_moe_matches_single_process(attention_moe, ep):
    assert_parallel_matches(attention_moe, PROMPTS, tp=2, ep=ep)


@pytest.mark.parametrize("arch,ep", [("Qwen3_5ForCausalLM", False),
                                     ("Qwen3_5MoeForCausalLM", False),
                                     ("Qwen3_5MoeForCausalLM", True),
                                     ("Qwen3NextForCausalLM", False),
                                     ("Qwen3NextForCausalLM", True)])
def test_hybrid_model_matches_single_process(checkpoints, arch, ep):
    # tiny configs: 2 key heads of 4 value heads -> one key-head group per rank
    assert_parallel_matches(checkpoints[arch], PROMPTS, tp=2, ep=ep)


def test_quantized_hybrid_model_matches_single_process(registry, tmp_path):
    from atlas_core.testing.quant_checkpoints import write_quantized_checkpoint
    # NVFP4 rows cut anywhere; each rank's in_proj / out_proj stay quantized
    q = write_quantized_checkpoint("Qwen3_5MoeForCausalLM", tmp_path / "q", "nvfp4_modelopt",
                                   registry=registry)
    assert_parallel_matches(q, PROMPTS, tp=2, dtype="float32")
