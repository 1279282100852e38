"""This plugin's CUDA kernels compile with NVRTC for every hardware target (no GPU needed),
found the way the cuda backend finds them: after atlas-cuda's generic sources, whose
``common.cuh`` they include."""

from __future__ import annotations

import pytest

from atlas_core.testing.gpu import (assert_kernel_module_compiles, assert_kernel_module_found,
                                    nvrtc_compiler_or_skip, plugin_kernel_sources)

compiler = nvrtc_compiler_or_skip()

ARCHS = ("sm_90a", "sm_121")


def _sources():
    from atlas_nccl.cuda_ops import kernel_dir
    return plugin_kernel_sources(kernel_dir())


def test_parallel_module_is_found_after_the_generic_sources():
    sources = _sources()
    assert_kernel_module_found(sources, "parallel")
    assert sources.variants("parallel") == list(compiler.DTYPE_VARIANTS)


@pytest.mark.parametrize("arch", ARCHS)
def test_parallel_kernels_compile(arch):
    assert_kernel_module_compiles(_sources(), "parallel", arch, variants=["bf16"])


@pytest.mark.parametrize("arch", ARCHS)
def test_p2p_allreduce_kernels_compile(arch):
    """Both protocols' kernels (atlas_nccl.p2p.MODES) for every dtype the path takes."""
    from atlas_nccl.p2p import MODES
    sources = _sources()
    assert_kernel_module_found(sources, "p2p_allreduce")
    for variant in compiler.DTYPE_VARIANTS:
        cubin = compiler.compile_module(sources, "p2p_allreduce", variant, arch, None)
        for name in MODES.values():
            assert f"{name}_{variant}".encode() + b"\0" in cubin, (name, variant)
