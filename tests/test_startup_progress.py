"""Start-up progress: weight loading logs counts, percent and time (kernel compiles: see
test_kernels_compile.py)."""

from __future__ import annotations

import logging

import pytest

from atlas_core.llm import LLM
from atlas_core.model import weight_loading
from atlas_core.testing.checkpoints import write_tiny_checkpoint

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(write_tiny_checkpoint("Qwen3ForCausalLM", tmp_path_factory.mktemp("qwen3")))


def test_load_logs_a_summary_and_progress(model_dir, caplog, monkeypatch):
    monkeypatch.setattr(weight_loading, "PROGRESS_INTERVAL_S", 0.0)
    with caplog.at_level(logging.INFO, logger="atlas_core"):
        LLM(model_dir, backend="numpy", num_kv_blocks=16)
    messages = [r.getMessage() for r in caplog.records]
    steps = [m for m in messages if m.startswith("loading weights: ")]
    assert steps and "%)" in steps[0] and steps[0].endswith(" s")
    summary = [m for m in messages if m.startswith("loaded ") and "weight tensors" in m]
    assert len(summary) == 1 and summary[0].endswith(" s")
    total = int(summary[0].split()[1])
    assert len(steps) == total - 1 and steps[-1].startswith(f"loading weights: {total - 1}/{total}")
    assert any(m.startswith("loading ") and "numpy backend" in m for m in messages)
    assert any(m.startswith("model ready in ") for m in messages)


def test_short_load_logs_only_the_summary(model_dir, caplog):
    with caplog.at_level(logging.INFO, logger="atlas_core"):
        LLM(model_dir, backend="numpy", num_kv_blocks=16)
    messages = [r.getMessage() for r in caplog.records]
    assert not [m for m in messages if m.startswith("loading weights: ")]
    assert [m for m in messages if "weight tensors" in m]
