"""Nemotron-H split over two processes (numpy backend, ``cpu`` comm): Mamba-2 heads with their
B/C groups, attention heads, the squared-ReLU MLP and the MoE with its shared expert give the
single-process greedy tokens, tensor and expert parallel; a checkpoint saved under ``model.``
(transformers 5, stacked experts) splits as one under ``backbone.``."""

from __future__ import annotations

import numpy as np
import pytest
from nemotron_checkpoints import save_model_prefixed

from atlas_core.testing.checkpoints import write_tiny_checkpoint
from atlas_core.testing.parallel import assert_parallel_matches

pytestmark = pytest.mark.timeout(180)

PROMPTS = [np.random.default_rng(s).integers(0, 370, n).tolist() for s, n in ((1, 21), (2, 4))]


@pytest.fixture(scope="module")
def tiny(registry, tmp_path_factory):
    # 8 Mamba-2 heads in 2 B/C groups -> one group of 4 heads per rank
    return write_tiny_checkpoint("NemotronHForCausalLM", tmp_path_factory.mktemp("nemotron"),
                                 registry=registry)


def test_tensor_and_expert_parallel_match_single_process(tiny):
    single = assert_parallel_matches(tiny, PROMPTS, tp=2)
    assert_parallel_matches(tiny, PROMPTS, tp=2, ep=True, single=single)


def test_model_prefixed_checkpoint_splits(tiny, tmp_path):
    renamed = save_model_prefixed(tiny, tmp_path / "model_prefix")
    single = assert_parallel_matches(renamed, PROMPTS, tp=2)
    assert_parallel_matches(renamed, PROMPTS, tp=2, ep=True, single=single)
