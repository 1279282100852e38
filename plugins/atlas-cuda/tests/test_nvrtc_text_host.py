"""NVRTC's log and PTX are read into fresh buffers (no GPU needed): handing NVRTC ``b" " * 1``
for an empty log wrote into CPython's shared one-byte ``b" "``, after which every safetensors
header of the test process was padded with NUL bytes (the single-process suite's leak, #30)."""

import pytest

pytest.importorskip("cuda.bindings")
from cuda.bindings import nvrtc  # noqa: E402

from atlas_cuda.compiler import nvrtc_program_text  # noqa: E402


@pytest.fixture(scope="module")
def program():
    _, prog = nvrtc.nvrtcCreateProgram(b'extern "C" __global__ void k(float *x) { x[0] = 1; }',
                                       b"k.cu", 0, [], [])
    err, = nvrtc.nvrtcCompileProgram(prog, 1, [b"-arch=sm_90a"])
    assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS
    yield prog
    nvrtc.nvrtcDestroyProgram(prog)


def test_an_empty_log_leaves_the_shared_one_byte_bytes_alone(program):
    assert nvrtc.nvrtcGetProgramLogSize(program)[1] == 1
    assert nvrtc_program_text(program, "log") == ""
    assert [i for i in range(256) if bytes([i])[0] != i] == []
    assert b" " * 3 == bytes([32, 32, 32])


def test_ptx_is_the_whole_text_without_its_nul(program):
    ptx = nvrtc_program_text(program, "ptx")
    assert ".entry k(" in ptx and ".target sm_90a" in ptx and "\0" not in ptx


def test_a_failed_compile_returns_the_error_text():
    _, prog = nvrtc.nvrtcCreateProgram(b"__global__ void k() { undeclared(); }", b"bad.cu", 0,
                                       [], [])
    err, = nvrtc.nvrtcCompileProgram(prog, 1, [b"-arch=sm_90a"])
    assert err != nvrtc.nvrtcResult.NVRTC_SUCCESS
    assert "undeclared" in nvrtc_program_text(prog, "log")
    nvrtc.nvrtcDestroyProgram(prog)
