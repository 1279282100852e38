"""Every CUDA kernel compiles with NVRTC for every hardware target (no GPU needed).

The bf16 build of every module (what models run) is compiled to a cubin for sm_90a (Hopper)
and sm_121 (GB10); the f16 / f32 builds get NVRTC's front-end check only, to keep CI fast.
"""

from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

pytest.importorskip("cuda.core")
compiler = pytest.importorskip("atlas_cuda.compiler")

ROOT = Path(__file__).resolve().parents[1] / "kernels"
TARGETS = {"hopper": "sm_90a", "gb10": "sm_121"}


def _dirs(hw):
    return [d for d in (ROOT / hw / "common", ROOT / "cuda" / "common") if d.is_dir()]


def _build(job):
    hw, module, variant = job
    sources = compiler.KernelSources(_dirs(hw))
    if variant in ("bf16", "any"):
        return len(compiler.compile_module(sources, module, variant, TARGETS[hw], None))
    from cuda.bindings import nvrtc
    t, s, mma = compiler.DTYPE_VARIANTS[variant]
    opts = [f"-arch={TARGETS[hw]}", "-std=c++17", "-fdevice-syntax-only",
            f"-DATLAS_T={t}", f"-DATLAS_S={s}", f"-DATLAS_MMA={mma}"]
    _, prog = nvrtc.nvrtcCreateProgram(sources.text(module + ".cu").encode(), b"k.cu", 0, [], [])
    err, = nvrtc.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts])
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        _, size = nvrtc.nvrtcGetProgramLogSize(prog)
        log = b" " * size
        nvrtc.nvrtcGetProgramLog(prog, log)
        raise AssertionError(f"{module}.cu {variant} {hw}: {log.decode(errors='replace')}")
    return 0


def test_every_kernel_compiles_for_every_target():
    jobs = []
    for hw in TARGETS:
        sources = compiler.KernelSources(_dirs(hw))
        assert sources.modules(), f"no kernel sources for {hw}"
        jobs += [(hw, m, v) for m in sources.modules() for v in sources.variants(m)]
    with ProcessPoolExecutor(max_workers=2) as pool:
        sizes = list(pool.map(_build, jobs))
    assert all(size >= 0 for size in sizes)


def test_compile_error_is_reported(tmp_path):
    (tmp_path / "broken.cu").write_text('extern "C" __global__ void k() { undefined_thing(); }\n')
    with pytest.raises(compiler.KernelCompileError, match="broken.cu"):
        compiler.compile_module(compiler.KernelSources([tmp_path]), "broken", "any", "sm_90a", None)


def test_disk_cache_skips_second_compile(tmp_path):
    sources = compiler.KernelSources(_dirs("hopper"))
    first = compiler.compile_module(sources, "sampling", "any", "sm_90a", tmp_path)
    cached = list(tmp_path.glob("*.cubin"))
    assert len(cached) == 1
    cached[0].write_bytes(b"sentinel")
    assert compiler.compile_module(sources, "sampling", "any", "sm_90a", tmp_path) == b"sentinel"
    assert first != b"sentinel"
