"""Every CUDA kernel compiles with NVRTC for every hardware target (no GPU needed).

Every build of every module (bf16, f16, f32) gets NVRTC's front-end check for sm_90a (Hopper)
and sm_121 (GB10), and a fixed sample of modules (``CUBIN_SAMPLE``: the matmul, MoE, attention
and sampling families, with inline PTX) is compiled to a cubin. The slow job
(``pytest -m slow``, run by ``.ci/run`` after the default run) compiles the bf16 build of every
module to a cubin; the largest take close to a minute each on one core, too long for the
default run on a loaded 2-core CI box.
"""

import logging
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

pytest.importorskip("cuda.core")
compiler = pytest.importorskip("atlas_cuda.compiler")

ROOT = Path(__file__).resolve().parents[1] / "kernels"
TARGETS = {"hopper": "sm_90a", "gb10": "sm_121"}


def _dirs(hw):
    return [d for d in (ROOT / hw / "common", ROOT / "cuda" / "common") if d.is_dir()]


#: Modules compiled to a cubin in the default run (every target): cheap ones that cover the
#: mma.sync GEMM, the MoE, prefill attention, sampling and logits-filter code.
CUBIN_SAMPLE = ("linear", "moe", "flash_attention", "rope_cache", "sampling", "logits_filters")
#: The slowest full compiles, started first so the pool's workers finish together.
SLOWEST_FIRST = ("attention_decode", "attention_rope_decode", "gemv_norm", "moe_block",
                 "moe_experts1")


def _build(job):
    hw, module, variant, cubin = job
    sources = compiler.KernelSources(_dirs(hw))
    if cubin:
        return len(compiler.compile_module(sources, module, variant, TARGETS[hw], None))
    from cuda.bindings import nvrtc
    t, s, mma = compiler.DTYPE_VARIANTS.get(variant, compiler.DTYPE_VARIANTS["bf16"])
    opts = [f"-arch={TARGETS[hw]}", "-std=c++17", "-fdevice-syntax-only",
            f"-DATLAS_T={t}", f"-DATLAS_S={s}", f"-DATLAS_MMA={mma}"]
    _, prog = nvrtc.nvrtcCreateProgram(sources.text(module + ".cu").encode(), b"k.cu", 0, [], [])
    err, = nvrtc.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts])
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise AssertionError(f"{module}.cu {variant} {hw}: "
                             f"{compiler.nvrtc_program_text(prog, 'log')}")
    return 0


def _jobs(cubin_modules) -> list[tuple[str, str, str, bool]]:
    """Every (target, module, variant): a cubin build for ``cubin_modules``' bf16 / any
    variant, NVRTC's front-end check for the rest."""
    jobs = []
    for hw in TARGETS:
        sources = compiler.KernelSources(_dirs(hw))
        assert sources.modules(), f"no kernel sources for {hw}"
        jobs += [(hw, m, v, v in ("bf16", "any") and (cubin_modules is None or m in cubin_modules))
                 for m in sources.modules() for v in sources.variants(m)]
    return sorted(jobs, key=lambda j: (not j[3], j[1] not in SLOWEST_FIRST))


def _run(jobs) -> list[int]:
    with ProcessPoolExecutor(max_workers=max(2, os.cpu_count() or 1)) as pool:
        return list(pool.map(_build, jobs))


def test_every_kernel_passes_the_front_end_and_a_sample_compiles():
    jobs = _jobs(CUBIN_SAMPLE)
    assert {j[1] for j in jobs if j[3]} == set(CUBIN_SAMPLE), "CUBIN_SAMPLE names a lost module"
    sizes = _run(jobs)
    assert all(size > 0 for size, job in zip(sizes, jobs) if job[3])


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_every_kernel_compiles_for_every_target():
    jobs = _jobs(None)
    sizes = _run(jobs)
    assert all(size > 0 for size, job in zip(sizes, jobs) if job[3])


def test_compile_error_is_reported(tmp_path):
    (tmp_path / "broken.cu").write_text('extern "C" __global__ void k() { undefined_thing(); }\n')
    with pytest.raises(compiler.KernelCompileError, match="broken.cu"):
        compiler.compile_module(compiler.KernelSources([tmp_path]), "broken", "any", "sm_90a", None)


def test_disk_cache_skips_second_compile(tmp_path, caplog):
    sources = compiler.KernelSources(_dirs("hopper"))
    with caplog.at_level(logging.INFO, logger="atlas_cuda"):
        first = compiler.compile_module(sources, "sampling", "any", "sm_90a", tmp_path)
        cached = list(tmp_path.glob("*.cubin"))
        assert len(cached) == 1
        cached[0].write_bytes(b"sentinel")
        assert compiler.compile_module(sources, "sampling", "any", "sm_90a", tmp_path) == b"sentinel"
    assert first != b"sentinel"
    logged = [r.getMessage() for r in caplog.records if r.name == "atlas_cuda.compiler"]
    assert len(logged) == 1, "a cache hit logs nothing"
    assert logged[0].startswith("NVRTC compiled sampling.cu (any, sm_90a) in ")
    assert "modules compiled so far" in logged[0]
