"""The testing kit's GPU probe: without a device (or without atlas-cuda) gpu tests skip."""

import pytest

from atlas_core.testing import gpu


def test_no_device_skips_instead_of_failing(monkeypatch):
    monkeypatch.setattr(gpu, "cuda_device_count", lambda: 0)
    assert not gpu.cuda_device_available()
    with pytest.raises(pytest.skip.Exception, match="no CUDA device"):
        gpu.cuda_backend_or_skip()


def test_a_device_gives_the_registrys_cuda_backend(monkeypatch):
    made = []

    class FakeRegistry:
        def create(self, kind, name):
            made.append((kind, name))
            return "backend"

    monkeypatch.setattr(gpu, "cuda_device_count", lambda: 1)
    assert gpu.cuda_backend_or_skip(FakeRegistry()) == "backend"
    assert made == [("gpu_backends", "cuda")]
