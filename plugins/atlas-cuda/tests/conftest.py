"""GPU fixtures: one CudaBackend per session; every test here is skipped without a device."""

import pytest

from cuda_probe import HAS_GPU


@pytest.fixture(scope="session")
def cuda_backend():
    if not HAS_GPU:
        pytest.skip("no CUDA device")
    from atlas_cuda.backend import CudaBackend
    return CudaBackend()


@pytest.fixture
def use_policy(cuda_backend):
    """``use_policy(moe="gemv", gemv_tile="g2s1", ...)``: run the session backend with those
    kernel policy fields (values spelled as in ``ATLAS_CUDA_*``) until the test ends."""
    import dataclasses

    from atlas_cuda.policy import parse_value

    original = cuda_backend.policy

    def use(**fields):
        parsed = {k: parse_value(k, v, f"use_policy {k}") for k, v in fields.items()}
        cuda_backend.set_policy(dataclasses.replace(original, **parsed))

    yield use
    cuda_backend.set_policy(original)
