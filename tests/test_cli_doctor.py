"""`atlas doctor` shows the hardware targets (through the plugin registry) and the kernel policy
each resolves to, environment overrides named (no GPU needed)."""

import pytest

from atlas_core.cli import main

pytest.importorskip("atlas_cuda")


def test_doctor_shows_targets_and_their_policy(monkeypatch, capsys):
    monkeypatch.setenv("ATLAS_CUDA_MOE", "gemv")
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "kernel target hopper: sm_90a (GPUs 9.0)" in out
    assert "kernel target gb10: sm_121 (GPUs 12.1)" in out
    policies = [line for line in out.splitlines() if line.startswith("  kernel policy: ")]
    assert len(policies) >= 3  # hopper, gb10 and the generic target
    assert all("moe=gemv (ATLAS_CUDA_MOE)" in line and "gemm=auto" in line for line in policies)


def test_doctor_reports_an_invalid_policy_variable(monkeypatch, capsys):
    monkeypatch.setenv("ATLAS_CUDA_GEMV_TILE", "g3s9")
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "kernel policy: INVALID (ATLAS_CUDA_GEMV_TILE='g3s9' is not valid" in out
