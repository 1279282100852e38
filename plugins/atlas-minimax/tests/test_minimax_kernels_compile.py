"""This plugin's CUDA kernel compiles with NVRTC for every hardware target and dtype (no GPU
needed), found the way the cuda backend finds it: after atlas-cuda's generic sources, whose
``common.cuh`` it includes (as plugins/atlas-qwen35's kernels are checked)."""

from __future__ import annotations

import pytest

pytest.importorskip("cuda.core")
compiler = pytest.importorskip("atlas_cuda.compiler")

ARCHS = ("sm_90a", "sm_121")


def _sources():
    from atlas_cuda.targets import generic_kernel_dir

    from atlas_minimax.cuda import kernel_dir
    return compiler.KernelSources([generic_kernel_dir() / "common", kernel_dir()])


def test_the_routing_kernel_is_found_after_the_generic_sources():
    sources = _sources()
    assert "moe_route_biased" in sources.modules()
    assert sources.find("moe_route_biased.cu").parent == sources.search_dirs[-1]


@pytest.mark.parametrize("arch", ARCHS)
def test_the_routing_kernel_compiles_for_every_dtype(arch):
    sources = _sources()
    for variant in sources.variants("moe_route_biased"):
        assert len(compiler.compile_module(sources, "moe_route_biased", variant, arch, None)) > 0
