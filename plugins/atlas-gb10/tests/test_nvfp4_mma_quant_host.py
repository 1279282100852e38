"""GB10's NVFP4 GEMM (``kernels/gb10/common/nvfp4_mma.cu``) without a GB10: it compiles for
sm_121a with the block-scaled FP4 MMA (and for plain sm_121 without it), the target declares
that arch for the module, and the operand layout the kernel assumes (``atlas_gb10.nvfp4_layout``,
the same index functions) reproduces a dequantized matmul when the MMA is emulated in NumPy."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from atlas_core.api import dequantize, quantize, unpack_e2m1
from atlas_gb10 import nvfp4_layout as lay

rng = np.random.default_rng(7)
KERNELS = Path(__file__).resolve().parents[1] / "atlas_gb10" / "kernels"


def _ptx(arch: str) -> str:
    pytest.importorskip("cuda.bindings")
    compiler = pytest.importorskip("atlas_cuda.compiler")
    from atlas_cuda.targets import generic_kernel_dir
    from cuda.bindings import nvrtc
    sources = compiler.KernelSources([KERNELS / "common", generic_kernel_dir() / "common"])
    src = sources.text("nvfp4_mma.cu").encode()
    opts = [f"-arch={arch}", "-std=c++17", "-DATLAS_T=bf16", "-DATLAS_S=bf16", "-DATLAS_MMA=1"]
    _, prog = nvrtc.nvrtcCreateProgram(src, b"nvfp4_mma.cu", 0, [], [])
    err, = nvrtc.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts])
    assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS, compiler.nvrtc_program_text(prog, "log")
    _, size = nvrtc.nvrtcGetCUBINSize(prog)
    assert size > 0, f"no cubin for {arch}"
    return compiler.nvrtc_program_text(prog, "ptx")


def test_compiles_for_sm_121a_with_the_block_scaled_fp4_mma():
    ptx = _ptx("sm_121a")
    assert ("mma.sync.aligned.m16n8k64.row.col.kind::mxf4nvf4.block_scale.scale_vec::4X"
            ".f32.e2m1.e2m1.f32.ue4m3") in ptx
    assert "trap;" not in ptx


def test_plain_sm_121_builds_a_trapping_kernel_instead():
    ptx = _ptx("sm_121")
    assert "mxf4nvf4" not in ptx and "trap;" in ptx


def test_the_gb10_target_builds_the_module_for_sm_121a():
    from atlas_gb10 import target
    t = target()
    assert t.hardware["module_arch"]["nvfp4_mma"] == "sm_121a"
    assert t.arch == "sm_121"


def test_swizzle_round_trips_and_puts_a_rows_slab_in_one_word():
    q = quantize(rng.standard_normal((24, 192)).astype(np.float32), "nvfp4")
    raw = q.scale.view(np.uint8)
    words = lay.swizzle_scales(q.scale)
    assert words.shape == (3, 24) and words.dtype == np.uint32
    assert np.array_equal(lay.unswizzle_scales(words), raw)
    assert words[2, 5] == int.from_bytes(bytes(raw[5, 8:12]), "little")


def test_swizzle_refuses_what_the_mma_cannot_take():
    with pytest.raises(ValueError, match="multiple of 64"):
        lay.swizzle_scales(np.zeros((4, 6), np.uint8))
    with pytest.raises(ValueError, match="non-negative"):
        lay.swizzle_scales(np.full((4, 4), 0x80, np.uint8))


def test_fragments_cover_each_tile_word_exactly_once():
    a = {lay.a_word(lane, r, 0) for lane in range(32) for r in range(4)}
    b = {lay.b_word(lane, r, 0) for lane in range(32) for r in range(2)}
    c = {lay.c_index(lane, i) for lane in range(32) for i in range(4)}
    assert a == {(r, w) for r in range(16) for w in range(8)}
    assert b == {(n, w) for n in range(8) for w in range(8)}
    assert c == {(r, n) for r in range(16) for n in range(8)}
    assert {lay.scale_a_row(lane) for lane in range(32)} == set(range(16))


def test_words_are_the_checkpoints_packing():
    q = quantize(rng.standard_normal((8, 64)).astype(np.float32), "nvfp4")
    words = np.ascontiguousarray(q.data).view("<u4")
    assert np.array_equal(lay.unpack_words(words), unpack_e2m1(q.data))


def test_one_emulated_mma_is_the_scaled_tile_product():
    xq, xs, _ = lay.quantize_rows(rng.standard_normal((16, 64)))
    w = quantize(rng.standard_normal((8, 64)).astype(np.float32), "nvfp4")
    wq = np.ascontiguousarray(w.data).view("<u4")
    a, b, sa, sb = lay.lane_operands(xq, lay.swizzle_scales(xs), wq,
                                     lay.swizzle_scales(w.scale), 0, 0, 0)
    c = lay.mma_emulate(np.zeros((32, 4), np.float32), a, b, sa, sb)
    va = lay.unpack_words(xq) * np.repeat(lay.ue4m3(xs), 16, axis=1)
    vb = lay.unpack_words(wq) * np.repeat(lay.ue4m3(w.scale.view(np.uint8)), 16, axis=1)
    want = va @ vb.T
    got = np.zeros((16, 8), np.float32)
    for lane in range(32):
        for i in range(4):
            got[lay.c_index(lane, i)] = c[lane, i]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_whole_gemm_as_the_kernel_tiles_it_matches_the_dequantized_product():
    M, N, K = 32, 16, 128
    x = rng.standard_normal((M, K)).astype(np.float32)
    w = quantize(rng.standard_normal((N, K)).astype(np.float32) * 0.05, "nvfp4")
    xq, xs, xg = lay.quantize_rows(x)
    wq = np.ascontiguousarray(w.data).view("<u4")
    y = lay.gemm_emulate(xq, lay.swizzle_scales(xs), xg, wq, lay.swizzle_scales(w.scale),
                         float(w.global_scale), M, N, K)
    x_deq = lay.unpack_words(xq) * np.repeat(lay.ue4m3(xs), 16, axis=1) * xg[:, None]
    np.testing.assert_allclose(y, x_deq @ dequantize(w).T, rtol=1e-5, atol=1e-5)
    exact = x @ dequantize(w).T
    assert np.abs(y - exact).max() < 0.15 * np.abs(exact).max(), "W4A4 stays near W4A16"


def test_the_kernel_library_builds_a_module_for_the_arch_its_target_names(monkeypatch):
    kernels_loader = pytest.importorskip("atlas_cuda.kernels_loader")
    from atlas_gb10 import target
    built = []

    class Stop(Exception):
        pass

    def fake_compile(sources, module, variant, arch, cache_dir):
        built.append((module, arch))
        raise Stop

    monkeypatch.setattr(kernels_loader, "compile_module", fake_compile)
    lib = kernels_loader.KernelLibrary(target(), backend=None)
    for module in ("nvfp4_mma", "quant_linear"):
        with pytest.raises(Stop):
            lib.kernel(module, "bf16", "k")
    assert built == [("nvfp4_mma", "sm_121a"), ("quant_linear", "sm_121")]
