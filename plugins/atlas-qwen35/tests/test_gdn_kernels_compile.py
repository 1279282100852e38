"""This plugin's CUDA kernels compile with NVRTC for every hardware target (no GPU needed), found
the way the cuda backend finds them: after atlas-cuda's generic sources, whose ``common.cuh``
and ``mma.cuh`` they include. The bf16 build (what models run) of every module passes NVRTC's
front end for sm_90a (Hopper) and sm_121 (GB10), and ``CUBIN_SAMPLE`` (both with inline PTX)
compiles to cubins for both; the slow job (``pytest -m slow``) compiles every module to a cubin
(``gdn_chunked`` alone takes ~15 s per target on one core), as tests/test_kernels_compile.py
does for atlas-cuda's own kernels.
"""

from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor

import pytest

pytest.importorskip("cuda.core")
compiler = pytest.importorskip("atlas_cuda.compiler")

ARCHS = ("sm_90a", "sm_121")
MODULES = ("gdn", "delta_rule", "gdn_chunked")
CUBIN_SAMPLE = ("gdn", "delta_rule")


def _sources():
    from atlas_cuda.targets import generic_kernel_dir
    from atlas_qwen35.cuda import kernel_dir
    return compiler.KernelSources([generic_kernel_dir() / "common", kernel_dir()])


def _build(job):
    module, arch, cubin = job
    if cubin:
        return len(compiler.compile_module(_sources(), module, "bf16", arch, None))
    from cuda.bindings import nvrtc
    t, s, mma = compiler.DTYPE_VARIANTS["bf16"]
    opts = [f"-arch={arch}", "-std=c++17", "-fdevice-syntax-only", f"-DATLAS_T={t}",
            f"-DATLAS_S={s}", f"-DATLAS_MMA={mma}"]
    _, prog = nvrtc.nvrtcCreateProgram(_sources().text(module + ".cu").encode(), b"k.cu", 0, [],
                                       [])
    err, = nvrtc.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts])
    assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS, \
        f"{module}.cu {arch}: {compiler.nvrtc_program_text(prog, 'log')}"
    return 1


def _run(cubin_modules) -> None:
    jobs = [(m, a, cubin_modules is None or m in cubin_modules) for m in MODULES for a in ARCHS]
    with ProcessPoolExecutor(max_workers=2) as pool:
        sizes = list(pool.map(_build, jobs))
    assert all(size > 0 for size in sizes), dict(zip(jobs, sizes))


def test_plugin_modules_are_found_after_the_generic_sources():
    sources = _sources()
    assert set(MODULES) <= set(sources.modules())
    assert all(sources.variants(m) == list(compiler.DTYPE_VARIANTS) for m in MODULES)
    assert sources.find("gdn.cu").parent == sources.search_dirs[-1]


def test_every_plugin_kernel_passes_the_front_end_and_a_sample_compiles():
    _run(CUBIN_SAMPLE)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_every_plugin_kernel_compiles_for_every_target():
    _run(None)
