"""This plugin's CUDA kernels compile with NVRTC for every hardware target (no GPU needed),
found the way the cuda backend finds them: after atlas-cuda's generic sources, whose
``common.cuh`` they include. bf16 builds to cubins for sm_90a (Hopper) by default, every dtype
variant for sm_90a and sm_121 (GB10) in the slow job; the wrappers resolve with the references'
signatures.
"""

from __future__ import annotations

import inspect
from concurrent.futures import ProcessPoolExecutor

import pytest

from atlas_core.api import resolve
from atlas_nemotron_h.plugin import OPS

pytest.importorskip("cuda.core")
compiler = pytest.importorskip("atlas_cuda.compiler")

ARCHS = ("sm_90a", "sm_121")
MODULES = ("mamba2", "mamba2_decode", "nemotron_moe")


def _sources():
    from atlas_cuda.targets import generic_kernel_dir
    from atlas_nemotron_h.cuda import kernel_dir
    return compiler.KernelSources([generic_kernel_dir() / "common", kernel_dir()])


def _build(job):
    module, variant, arch = job
    return len(compiler.compile_module(_sources(), module, variant, arch, None))


def test_modules_are_found_after_the_generic_sources():
    sources = _sources()
    assert set(MODULES) <= set(sources.modules())
    assert all(sources.variants(m) == list(compiler.DTYPE_VARIANTS) for m in MODULES)
    assert sources.find("mamba2.cu").parent == sources.search_dirs[-1]


def _build_all(jobs):
    with ProcessPoolExecutor(max_workers=2) as pool:
        sizes = list(pool.map(_build, jobs))
    assert all(size > 0 for size in sizes), dict(zip(jobs, sizes))


def test_every_module_compiles_in_bf16_for_hopper():
    _build_all([(m, "bf16", "sm_90a") for m in MODULES])


@pytest.mark.slow
def test_every_module_compiles_in_every_variant_for_every_target():
    _build_all([(m, v, a) for m in MODULES for v in compiler.DTYPE_VARIANTS for a in ARCHS])


def test_cuda_wrappers_have_the_reference_signatures():
    for spec, _, cuda in OPS:
        if cuda is None:
            continue
        method = resolve(cuda.rpartition(".")[0])
        got = list(inspect.signature(getattr(method, spec.name)).parameters.values())[1:]
        want = inspect.signature(resolve(spec.reference)).parameters.values()
        assert [(p.name, p.kind, p.default) for p in got] == \
            [(p.name, p.kind, p.default) for p in want], spec.name
