"""This plugin's CUDA kernels compile with NVRTC for every hardware target and dtype (no GPU
needed), found the way the cuda backend finds them: after atlas-cuda's generic sources, whose
``common.cuh`` they include."""

from __future__ import annotations

import pytest

from atlas_core.testing.gpu import (assert_kernel_module_compiles, assert_kernel_module_found,
                                    nvrtc_compiler_or_skip, plugin_kernel_sources)

nvrtc_compiler_or_skip()

ARCHS = ("sm_90a", "sm_121")


def _sources():
    from atlas_qwen3vl.cuda import kernel_dir
    return plugin_kernel_sources(kernel_dir())


def test_the_vision_kernels_are_found_after_the_generic_sources():
    assert_kernel_module_found(_sources(), "vision")


@pytest.mark.parametrize("arch", ARCHS)
def test_the_vision_kernels_compile_for_every_dtype(arch):
    assert_kernel_module_compiles(_sources(), "vision", arch)
