"""This plugin's CUDA kernels compile with NVRTC for every hardware target (no GPU needed),
found the way the cuda backend finds them: after atlas-cuda's generic sources, whose
``common.cuh`` they include."""

from __future__ import annotations

import pytest

pytest.importorskip("cuda.core")
compiler = pytest.importorskip("atlas_cuda.compiler")

ARCHS = ("sm_90a", "sm_121")


def _sources():
    from atlas_cuda.targets import generic_kernel_dir
    from atlas_nccl.cuda_ops import kernel_dir
    return compiler.KernelSources([generic_kernel_dir() / "common", kernel_dir()])


def test_parallel_module_is_found_after_the_generic_sources():
    sources = _sources()
    assert "parallel" in sources.modules()
    assert sources.variants("parallel") == list(compiler.DTYPE_VARIANTS)
    assert sources.find("parallel.cu").parent == sources.search_dirs[-1]


@pytest.mark.parametrize("arch", ARCHS)
def test_parallel_kernels_compile(arch):
    assert len(compiler.compile_module(_sources(), "parallel", "bf16", arch, None)) > 0
