"""This plugin's CUDA kernels (``mla.cu``, ``mla_attention.cu``, ``mla_decode_mma.cu``,
``mla_decode_keys.cu``, ``mla_decode_keys2.cu``, ``moe_route_grouped.cu``) compile with NVRTC
for every hardware target and dtype (no GPU needed), found the way the cuda backend finds them:
after atlas-cuda's generic sources, whose ``common.cuh`` they include. ``mla_decode_keys2``'s
kernels fit the registers their occupancy is planned on (16 warps an SM: <= 128 a thread) with
no spills."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("cuda.core")
compiler = pytest.importorskip("atlas_cuda.compiler")

#: Hopper in the default run; GB10 with the slow suite (every compile takes seconds).
ARCHS = ("sm_90a", pytest.param("sm_121", marks=pytest.mark.slow))
MODULES = ("mla", "mla_attention", "mla_decode_mma", "mla_decode_keys", "mla_decode_keys2",
           "moe_route_grouped")


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


def _ptxas_report(sources, module: str, variant: str, arch: str) -> dict[str, str]:
    """Each kernel of one build and ptxas' resource lines for it (``-Xptxas -v``)."""
    from cuda.bindings import nvrtc
    opts = compiler.build_options(arch, variant)
    args = [f"-arch={arch}", "-std=c++17", "-Xptxas", "-v"]
    args += [f"-D{name}={value}" for name, value in opts["define_macro"]]
    _, prog = nvrtc.nvrtcCreateProgram(sources.text(module + ".cu").encode(), b"k.cu", 0, [], [])
    err, = nvrtc.nvrtcCompileProgram(prog, len(args), [a.encode() for a in args])
    text = compiler.nvrtc_program_text(prog, "log")
    assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS, text
    report, name = {}, None
    for line in text.splitlines():
        found = re.search(r"Compiling entry function '(\w+)'", line)
        if found:
            name = found.group(1)
        elif name and ("Used" in line or "spill" in line):
            report[name] = report.get(name, "") + line
    return report


@pytest.mark.parametrize("variant", ("bf16", "f16"))
def test_the_pair_split_decode_kernels_fit_16_warps_an_sm(variant):
    report = _ptxas_report(_sources(), "mla_decode_keys2", variant, "sm_90a")
    assert sorted(report) == [f"mla_decode_keys2_r256_{variant}",
                              f"mla_decode_keys2x2_r256_{variant}"]
    for name, lines in report.items():
        regs = int(re.search(r"Used (\d+) registers", lines).group(1))
        assert regs <= 128, f"{name}: {lines}"
        assert "0 bytes spill stores, 0 bytes spill loads" in lines, f"{name}: {lines}"
