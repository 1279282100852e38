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


def test_doctor_says_whether_cublaslt_is_there_and_what_its_absence_costs(monkeypatch, capsys):
    import builtins
    import sys

    real_import = builtins.__import__

    def no_nvmath(name, *args, **kwargs):
        if name.startswith("nvmath"):
            raise ImportError("No module named 'nvmath'")
        return real_import(name, *args, **kwargs)

    monkeypatch.delitem(sys.modules, "nvmath", raising=False)
    monkeypatch.delitem(sys.modules, "nvmath.bindings", raising=False)
    monkeypatch.setattr(builtins, "__import__", no_nvmath)
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "cuBLASLt: not installed; pip install 'atlas-cuda[cublas]'" in out
    assert "2.5x slower" in out
