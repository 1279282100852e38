"""This plugin's CUDA kernels compile with NVRTC for every hardware target and dtype (no GPU
needed), found the way the cuda backend finds them: after atlas-cuda's generic sources, whose
``common.cuh`` they include."""

from __future__ import annotations

import pytest

pytest.importorskip("cuda.core")
compiler = pytest.importorskip("atlas_cuda.compiler")

ARCHS = ("sm_90a", "sm_121")


def _sources():
    from atlas_cuda.targets import generic_kernel_dir

    from atlas_qwen3vl.cuda import kernel_dir
    return compiler.KernelSources([generic_kernel_dir() / "common", kernel_dir()])


def test_the_vision_kernels_are_found_after_the_generic_sources():
    sources = _sources()
    assert "vision" in sources.modules()
    assert sources.find("vision.cu").parent == sources.search_dirs[-1]


@pytest.mark.parametrize("arch", ARCHS)
def test_the_vision_kernels_compile_for_every_dtype(arch):
    sources = _sources()
    for variant in sources.variants("vision"):
        assert len(compiler.compile_module(sources, "vision", variant, arch, None)) > 0
