"""This plugin's CUDA kernels compile with NVRTC for every hardware target (no GPU needed), found
the way the cuda backend finds them: after atlas-cuda's generic sources, whose ``common.cuh``
and ``attention_common.cuh`` they include.

Default run: NVRTC's front-end check of every dtype build of both modules for sm_90a (Hopper)
and sm_121 (GB10), and the elementwise module to a cubin. The attention modules (42 SIMT
kernels a dtype, 40 tensor-core ones in bf16 / f16: swa_mma and swa_fa; about a minute a cubin on one loaded core)
go to cubins in the slow job (``pytest -m slow``), for bf16 (what models run) and f32 (what
the GPU tests compare with numpy), where ptxas would report a register or shared-memory limit
the front end cannot see.
"""

from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor

import pytest

pytest.importorskip("cuda.core")
compiler = pytest.importorskip("atlas_cuda.compiler")

ARCHS = ("sm_90a", "sm_121")
MODULES = ("gemma4_elementwise", "gemma4_attention", "gemma4_attention_mma")


def _sources():
    from atlas_cuda.targets import generic_kernel_dir

    from atlas_gemma4.cuda import kernel_dir
    return compiler.KernelSources([generic_kernel_dir() / "common", kernel_dir()])


def _front_end(job):
    module, variant, arch = job
    from cuda.bindings import nvrtc
    t, s, mma = compiler.DTYPE_VARIANTS[variant]
    opts = [f"-arch={arch}", "-std=c++17", "-fdevice-syntax-only", f"-DATLAS_T={t}",
            f"-DATLAS_S={s}", f"-DATLAS_MMA={mma}"]
    _, prog = nvrtc.nvrtcCreateProgram(_sources().text(module + ".cu").encode(), b"k.cu", 0, [],
                                       [])
    err, = nvrtc.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts])
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        return compiler.nvrtc_program_text(prog, "log")
    return ""


def _cubin(job):
    module, variant, arch = job
    return len(compiler.compile_module(_sources(), module, variant, arch, None))


def test_plugin_modules_are_found_after_the_generic_sources():
    sources = _sources()
    assert set(MODULES) <= set(sources.modules())
    assert all(sources.variants(m) == list(compiler.DTYPE_VARIANTS) for m in MODULES)
    assert sources.find("gemma4_attention.cu").parent == sources.search_dirs[-1]


def test_every_build_passes_the_front_end_and_the_elementwise_kernels_compile():
    jobs = [(m, v, a) for m in MODULES for v in compiler.DTYPE_VARIANTS for a in ARCHS]
    with ProcessPoolExecutor(max_workers=2) as pool:
        logs = list(pool.map(_front_end, jobs))
        sizes = list(pool.map(_cubin, [("gemma4_elementwise", "bf16", a) for a in ARCHS]))
    assert not any(logs), dict(zip(jobs, logs))
    assert all(size > 0 for size in sizes)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_attention_kernels_compile_to_cubins():
    jobs = [(m, v, a) for m in MODULES[1:] for v in ("bf16", "f32") for a in ARCHS]
    with ProcessPoolExecutor(max_workers=2) as pool:
        sizes = list(pool.map(_cubin, jobs))
    assert all(size > 0 for size in sizes), dict(zip(jobs, sizes))
