"""On a CUDA GPU (marker ``gpu``, skipped without one; needs ``atlas-minimax[cuda]``):
``moe_route_biased`` matches its reference on its contract cases and a 300-token batch, and the
tiny MiniMax-M2 checkpoint decodes the same greedy tokens on cuda as on numpy (float32, 32
tokens, top logprobs within 1e-4; mixed prefill lengths and chunked prefill). Run on the lent
GPU: tests/gpu_session.sh (``pytest -m gpu plugins/atlas-minimax`` and the bench lines)."""

from __future__ import annotations

import numpy as np
import pytest

from atlas_core.api import Registry
from atlas_core.testing.checkpoints import write_tiny_checkpoint
from atlas_core.testing.gpu import assert_cuda_greedy_equals_numpy, cuda_backend_or_skip
from atlas_core.testing.contracts_cases import check_case

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cuda():
    return cuda_backend_or_skip()


def test_routing_op_matches_its_reference_on_cuda(cuda):
    from atlas_minimax.routing_cases import moe_route_biased_cases

    for case in moe_route_biased_cases():
        check_case(cuda, cuda.op_registry, "moe_route_biased", case)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_routing_at_a_prefill_batch_spans_several_blocks(cuda, dtype):
    """300 tokens (75 blocks of four tokens, a warp each), M2's 256 experts top-8, float32 bias."""
    from atlas_core.testing.contracts_cases import OpCase
    from atlas_core.testing.contracts_ops import make_rng, randn

    rng = make_rng("moe_route_biased-batch", dtype)
    logits = randn(rng, (300, 256), dtype, 2.0)
    bias = (0.1 * rng.standard_normal(256)).astype(np.float32)
    check_case(cuda, cuda.op_registry, "moe_route_biased",
               OpCase(f"{dtype}-300x256", (logits, bias, 8, True)))


def test_cuda_greedy_equals_numpy(cuda, tmp_path):
    path = write_tiny_checkpoint("MiniMaxM2ForCausalLM", tmp_path, registry=Registry(), seed=4)
    rng = np.random.default_rng(3)
    prompts = [rng.integers(0, 370, n).tolist() for n in (11, 5, 23)]
    assert_cuda_greedy_equals_numpy(path, prompts, atol=1e-4)
