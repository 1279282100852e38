"""scripts/decode_timeline.py's list of untraced kernels counts the launches of the timed graph
only (session 21's first version pooled every graph the engine had captured: a batch-8 timeline
listed the batch-1, 2 and 4 graphs' kernels too)."""

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "decode_timeline.py"


def _module():
    spec = importlib.util.spec_from_file_location("decode_timeline", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_untraced_counts_the_timed_graphs_launches_less_the_traced_ones():
    timeline = _module()
    launches = [("linear", (64, 1, 1), "gemm_32x64")] * 3 + [("rope_cache", (1, 1, 1), "rope_qkv")]
    last = [(0, 0, "rope_cache:rope_qkv (1, 1, 1)"), (1, 1, "linear:gemm_32x64 (64, 1, 1)")]
    lines = timeline.untraced(launches, last, "")
    assert lines[0].startswith("launches captured but not traced (4 captured in all, 2 traced")
    assert lines[1:] == ["  linear:gemm_32x64 (64, 1, 1) x2"]
    assert timeline.untraced(launches[3:], last[:1], "") == []
