"""This plugin's CUDA kernels compile with NVRTC for every hardware target (no GPU needed), found
the way the cuda backend finds them: after atlas-cuda's generic sources, whose ``common.cuh``
and ``mma.cuh`` they include. bf16 builds (what models run) to cubins for sm_90a (Hopper) and
sm_121 (GB10), as tests/test_kernels_compile.py does for atlas-cuda's own kernels.
"""

from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor

import pytest

pytest.importorskip("cuda.core")
compiler = pytest.importorskip("atlas_cuda.compiler")

ARCHS = ("sm_90a", "sm_121")
MODULES = ("gdn", "delta_rule", "gdn_chunked")


def _sources():
    from atlas_cuda.targets import generic_kernel_dir
    from atlas_qwen35.cuda import kernel_dir
    return compiler.KernelSources([generic_kernel_dir() / "common", kernel_dir()])


def _build(job):
    module, arch = job
    return len(compiler.compile_module(_sources(), module, "bf16", arch, None))


def test_plugin_modules_are_found_after_the_generic_sources():
    sources = _sources()
    assert set(MODULES) <= set(sources.modules())
    assert all(sources.variants(m) == list(compiler.DTYPE_VARIANTS) for m in MODULES)
    assert sources.find("gdn.cu").parent == sources.search_dirs[-1]


def test_every_plugin_kernel_compiles_for_every_target():
    jobs = [(m, a) for m in MODULES for a in ARCHS]
    with ProcessPoolExecutor(max_workers=2) as pool:
        sizes = list(pool.map(_build, jobs))
    assert all(size > 0 for size in sizes), dict(zip(jobs, sizes))
