"""This plugin's CUDA kernels (``mla.cu``, ``mla_attention.cu``, ``mla_decode_mma.cu``,
``mla_decode_keys.cu``, ``moe_route_grouped.cu``) compile with NVRTC for every hardware target
and dtype (no GPU needed), found the way the cuda backend finds them: after atlas-cuda's generic
sources, whose ``common.cuh`` they include."""

from __future__ import annotations

import pytest

pytest.importorskip("cuda.core")
compiler = pytest.importorskip("atlas_cuda.compiler")

#: Hopper in the default run; GB10 with the slow suite (every compile takes seconds).
ARCHS = ("sm_90a", pytest.param("sm_121", marks=pytest.mark.slow))
MODULES = ("mla", "mla_attention", "mla_decode_mma", "mla_decode_keys", "moe_route_grouped")


def _sources():
    from atlas_cuda.targets import generic_kernel_dir

    from atlas_deepseek.cuda import kernel_dir
    return compiler.KernelSources([generic_kernel_dir() / "common", kernel_dir()])


def test_the_kernels_are_found_after_the_generic_sources():
    sources = _sources()
    for module in MODULES:
        assert module in sources.modules()
        assert sources.find(f"{module}.cu").parent == sources.search_dirs[-1]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("module", MODULES)
def test_the_kernels_compile_for_every_dtype(module, arch):
    sources = _sources()
    for variant in sources.variants(module):
        assert len(compiler.compile_module(sources, module, variant, arch, None)) > 0
