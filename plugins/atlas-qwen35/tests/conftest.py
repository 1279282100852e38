"""Shared fixtures: tiny hybrid checkpoints (written once per session), the numpy backend and,
on a machine with a GPU, one cuda backend per session."""

from __future__ import annotations

import gc

import pytest

from atlas_core.api import Registry

from qwen35_cases import ARCHS, prompts  # noqa: F401 (re-exported for fixtures)


@pytest.fixture(scope="session")
def registry():
    reg = Registry()
    if "Qwen3_5ForCausalLM" not in reg.names("weight_loaders"):
        pytest.skip("atlas-qwen35 is not installed: pip install --no-deps -e plugins/atlas-qwen35")
    return reg


@pytest.fixture
def backend(registry):
    return registry.create("gpu_backends", "numpy")


@pytest.fixture(scope="session")
def checkpoints(registry, tmp_path_factory):
    from atlas_core.testing.checkpoints import write_tiny_checkpoint

    root = tmp_path_factory.mktemp("qwen35")
    return {arch: write_tiny_checkpoint(arch, root / arch, registry=registry) for arch in ARCHS}


@pytest.fixture(scope="session")
def cuda_backend():
    from qwen35_cuda_probe import HAS_GPU

    if not HAS_GPU:
        pytest.skip("no CUDA device, or atlas-cuda is missing: pip install atlas-qwen35[cuda]")
    from atlas_cuda.backend import CudaBackend
    return CudaBackend()


@pytest.fixture
def be(cuda_backend):
    """The session's cuda backend, left in the default (not batch-invariant) mode and with the
    test's engines collected after each test (their graphs hold device memory)."""
    yield cuda_backend
    cuda_backend.set_batch_invariant(False)
    gc.collect()
