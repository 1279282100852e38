"""The cuda backend resolves its kernel policy once, at creation (target, model, environment),
and binds a model only before its first kernel loads."""

import numpy as np
import pytest

from atlas_cuda.policy import KernelPolicy
from cuda_probe import HAS_GPU

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HAS_GPU, reason="no CUDA device")]


def test_environment_is_read_once_at_creation(monkeypatch):
    from atlas_cuda.backend import CudaBackend
    monkeypatch.setenv("ATLAS_CUDA_MOE", "gemv")
    be = CudaBackend(workspace_bytes=1 << 20)
    assert be.policy.moe == "gemv" and dict(be.policy.origins)["moe"] == "ATLAS_CUDA_MOE"
    assert be.ctx.policy is be.policy
    monkeypatch.setenv("ATLAS_CUDA_MOE", "grouped")
    assert be.policy.moe == "gemv"


def test_invalid_variable_fails_creation(monkeypatch):
    from atlas_cuda.backend import CudaBackend
    monkeypatch.setenv("ATLAS_CUDA_PDL", "sometimes")
    with pytest.raises(ValueError, match="ATLAS_CUDA_PDL='sometimes' is not valid"):
        CudaBackend(workspace_bytes=1 << 20)


def test_explicit_policy_and_pdl(monkeypatch):
    from atlas_cuda.backend import CudaBackend
    be = CudaBackend(workspace_bytes=1 << 20, policy=KernelPolicy(pdl=False))
    assert be.ctx.pdl is False
    be.set_policy(KernelPolicy())
    assert be.ctx.pdl == (tuple(be.capability) >= (9, 0))


def test_bind_model_again_is_a_noop_and_another_family_rebinds():
    from atlas_cuda.backend import CudaBackend
    be = CudaBackend(workspace_bytes=1 << 20)
    be.bind_model("qwen3", "bf16")
    assert be.ctx.kernels is be.kernels and be.ctx.launch == be.kernels.launch
    a = be.from_host(np.ones(8, np.float32))
    np.testing.assert_array_equal(be.to_host(be.ops.add(a, a)), 2 * np.ones(8, np.float32))
    library = be.kernels
    be.bind_model("qwen3_moe", "bf16")      # same target folder, same format: nothing changes
    assert be.kernels is library
    be.bind_model("qwen3", None)            # another format after kernels loaded: a new library
    assert be.kernels is not library and be.ctx.launch == be.kernels.launch
    np.testing.assert_array_equal(be.to_host(be.ops.add(a, a)), 2 * np.ones(8, np.float32))
