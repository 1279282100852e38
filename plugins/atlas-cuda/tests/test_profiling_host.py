"""The profiling scripts' helpers (no GPU needed): extra kernel-build macros and kernel names."""

import pytest

from atlas_cuda.compiler import add_define, extra_defines
from atlas_cuda.kernels_loader import kernel_family


def test_add_define_appends_once_and_keeps_the_others(monkeypatch):
    monkeypatch.setenv("ATLAS_CUDA_NVRTC_DEFINES", "ATLAS_X=0")
    add_define("ATLAS_TRACE")
    add_define("ATLAS_TRACE")
    assert extra_defines() == [("ATLAS_X", "0"), "ATLAS_TRACE"]
    monkeypatch.delenv("ATLAS_CUDA_NVRTC_DEFINES")
    add_define("ATLAS_PROFILE")
    assert extra_defines() == ["ATLAS_PROFILE"]


def test_bad_macro_names_are_refused(monkeypatch):
    monkeypatch.setenv("ATLAS_CUDA_NVRTC_DEFINES", "1BAD")
    with pytest.raises(ValueError, match="not a macro name"):
        extra_defines()


@pytest.mark.parametrize("name,family", [
    ("gemvn_p2_bf16_m1_g4", "gemvn_p2_m1_g4"),
    ("moe_experts1_t_w3_bf16", "moe_experts1_t_w3"),
    ("rope_attn_dec_fp8_f16_d128_h2", "rope_attn_dec_fp8_d128_h2"),
])
def test_kernel_family_drops_the_dtype_variant(name, family):
    assert kernel_family(name) == family
