"""On a CUDA GPU (marker ``gpu``, skipped without one; needs ``atlas-deepseek[cuda]``): every
case of this plugin's CUDA ops matches its reference, and tiny DeepSeek-V3 and Mistral-4
checkpoints decode the same greedy tokens on cuda (absorbed MLA for prefill and decode, decode
steps replayed from CUDA graphs) as on numpy (expanded prefill): float32, 32 tokens, top
logprobs within 1e-4, mixed prompt lengths crossing 8-token blocks, chunked prefill. Run on the
lent GPU: ``plugins/atlas-deepseek/tests/gpu_session.sh``."""

from __future__ import annotations

import numpy as np
import pytest

from atlas_core.api import OpRegistry, Registry, make_plugin_manager
from atlas_core.api import resolve
from atlas_core.testing.checkpoints import write_tiny_checkpoint
from atlas_core.testing.gpu import assert_cuda_greedy_equals_numpy, cuda_backend_or_skip
from atlas_core.testing.contracts_cases import check_case
from atlas_deepseek.plugin import OPS

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cuda():
    return cuda_backend_or_skip()


@pytest.mark.parametrize("name", [spec.name for spec, on_cuda in OPS if on_cuda])
def test_cuda_ops_match_their_references(cuda, name):
    ops = OpRegistry(Registry(make_plugin_manager()))
    for case in resolve(ops.spec(name).cases)():
        check_case(cuda, cuda.op_registry, name, case)


@pytest.mark.parametrize("arch", ["DeepseekV3ForCausalLM", "Mistral4ForCausalLM"])
def test_cuda_greedy_equals_numpy(cuda, arch, tmp_path):
    path = write_tiny_checkpoint(arch, tmp_path, registry=Registry(), seed=4)
    rng = np.random.default_rng(3)
    prompts = [rng.integers(0, 370, n).tolist() for n in (11, 5, 23)]
    assert_cuda_greedy_equals_numpy(path, prompts, atol=1e-4, dtype="float32")
