"""The kernel policy: resolved once from target defaults < model config < environment, frozen,
and a clear error naming the variable or file for a bad value (no GPU needed)."""

import dataclasses

import pytest

from atlas_cuda.policy import KNOBS, KernelPolicy, resolve, target_policy
from atlas_cuda.targets import Target


def test_defaults_are_todays_kernels():
    p = resolve({}, {}, {})
    assert p == KernelPolicy()
    assert (p.gemm, p.attention, p.pdl, p.moe, p.moe_fused, p.gemv_tile) == (
        "auto", "auto", True, "auto", "auto", None)
    assert (p.gdn_fused, p.gdn_prefill, p.gdn_decode) == (True, "auto", "auto")
    assert all(where == "default" for *_, where in p.describe())


def test_model_beats_hardware_and_environment_beats_both():
    hardware = {"moe": "gemv", "gemm": "mma", "pdl": False}
    model = {"moe": "grouped", "gemv_tile": "g2s1"}
    env = {"ATLAS_CUDA_GEMV_TILE": "g4s8", "ATLAS_CUDA_ATTENTION": "simt"}
    p = resolve(hardware, model, env, hardware_name="hopper", model_name="qwen3 MODEL.toml")
    assert (p.moe, p.gemm, p.pdl, p.gemv_tile, p.attention) == (
        "grouped", "mma", False, (4, 8), "simt")
    assert dict(p.origins) == {"moe": "qwen3 MODEL.toml", "gemm": "hopper", "pdl": "hopper",
                               "gemv_tile": "ATLAS_CUDA_GEMV_TILE",
                               "attention": "ATLAS_CUDA_ATTENTION"}


def test_empty_variables_count_as_unset():
    assert resolve({"moe": "gemv"}, None, {"ATLAS_CUDA_MOE": "  "}).moe == "gemv"


def test_policy_is_frozen():
    p = resolve({}, {}, {})
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.moe = "gemv"


@pytest.mark.parametrize("env,match", [
    ({"ATLAS_CUDA_MOE": "fast"}, r"ATLAS_CUDA_MOE='fast' is not valid; use one of auto, grouped"),
    ({"ATLAS_CUDA_PDL": "maybe"}, r"ATLAS_CUDA_PDL='maybe' is not valid; use 1 or 0"),
    ({"ATLAS_CUDA_GEMV_TILE": "g3s1"}, r"ATLAS_CUDA_GEMV_TILE='g3s1' is not valid; use auto or g"),
    ({"ATLAS_CUDA_GEMV_TILE": "old"}, r"ATLAS_CUDA_GEMV_TILE='old' is not valid"),
    ({"ATLAS_CUDA_GEMV_ROWS": "9"}, r"ATLAS_CUDA_GEMV_ROWS='9' is not valid; use auto or a row"),
    ({"ATLAS_CUDA_GEMV_ROWS": "0"}, r"ATLAS_CUDA_GEMV_ROWS='0' is not valid"),
])
def test_invalid_environment_values_name_the_variable(env, match):
    with pytest.raises(ValueError, match=match):
        resolve({}, {}, env)


def test_invalid_file_values_name_the_file_and_field():
    with pytest.raises(ValueError, match=r"hopper HARDWARE.toml \[policy\] moe_fused=2 is not "
                                         r"valid; use one of auto, 1, 0"):
        resolve({"moe_fused": 2}, {}, {}, hardware_name="hopper HARDWARE.toml")
    with pytest.raises(ValueError, match=r"MODEL.toml \[policy\] gemv_chunks: unknown kernel "
                                         r"policy field 'gemv_chunks'"):
        resolve({}, {"gemv_chunks": 8}, {}, model_name="MODEL.toml")


def test_toml_booleans_and_strings_parse_like_the_environment():
    assert resolve({"pdl": False, "gdn_fused": "off"}, {}, {}).pdl is False
    assert resolve({"moe_fused": True}, {}, {}).moe_fused == "1"


def test_removed_switches_are_not_read(monkeypatch):
    """The A/B switches whose default won are gone: setting them changes nothing."""
    for name in ("ATLAS_CUDA_ATTN_DECODE", "ATLAS_CUDA_GEMV_CHUNKS", "ATLAS_CUDA_MOE_ROUTER",
                 "ATLAS_CUDA_FUSE_GATE_UP", "ATLAS_CUDA_MOE_EXPERTS1"):
        monkeypatch.setenv(name, "x")
    assert resolve({}, {}) == KernelPolicy()


def test_summary_and_describe_show_every_field_and_its_origin():
    p = resolve({}, {}, {"ATLAS_CUDA_MOE": "gemv", "ATLAS_CUDA_GEMV_TILE": "g2s4"})
    rows = {name: (env, value, where) for name, env, value, where in p.describe()}
    assert list(rows) == [k.name for k in KNOBS]
    assert rows["moe"] == ("ATLAS_CUDA_MOE", "gemv", "ATLAS_CUDA_MOE")
    assert rows["gemv_tile"] == ("ATLAS_CUDA_GEMV_TILE", "g2s4", "ATLAS_CUDA_GEMV_TILE")
    assert rows["pdl"] == ("ATLAS_CUDA_PDL", "1", "default")
    assert "moe=gemv (ATLAS_CUDA_MOE)" in p.summary() and "pdl=1," in p.summary()


def test_target_policy_reads_hardware_then_model_toml(tmp_path):
    root = tmp_path / "hw"
    (root / "common").mkdir(parents=True)
    (root / "common" / "HARDWARE.toml").write_text(
        'name = "hw"\narch = "sm_90a"\ncompute_capability = ["9.0"]\n'
        '[policy]\nmoe = "gemv"\ngemm = "mma"\n')
    (root / "qwen3" / "bf16").mkdir(parents=True)
    (root / "qwen3" / "bf16" / "MODEL.toml").write_text('family = "qwen3"\n[policy]\nmoe = "grouped"\n')
    target = Target.from_dir(root)
    p = target_policy(target, "qwen3", "bf16", {})
    assert (p.moe, p.gemm) == ("grouped", "mma")
    assert dict(p.origins)["moe"].endswith("qwen3/bf16/MODEL.toml")
    assert target_policy(target, "llama", None, {}).moe == "gemv"
    assert target_policy(target, "qwen3", "bf16", {"ATLAS_CUDA_MOE": "auto"}).moe == "auto"


def test_shipped_targets_keep_the_default_policy():
    """HARDWARE.toml / MODEL.toml [policy] tables of the shipped targets parse, and hold today's
    kernel choices (changing one is a measured decision, not a side effect)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[3] / "kernels"
    for hw in ("hopper", "gb10"):
        target = Target.from_dir(root / hw)
        assert target_policy(target, "qwen3", "bf16", {}) == KernelPolicy()


def test_gemv_rows_parses_auto_and_counts():
    assert resolve({}, {}, {"ATLAS_CUDA_GEMV_ROWS": "auto"}).gemv_rows is None
    assert resolve({"gemv_rows": 2}, {}, {}).gemv_rows == 2
    assert "gemv_rows=1 (ATLAS_CUDA_GEMV_ROWS)" in resolve({}, {}, {"ATLAS_CUDA_GEMV_ROWS": "1"}).summary()
