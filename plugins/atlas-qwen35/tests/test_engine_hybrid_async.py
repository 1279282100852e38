"""Async scheduling on tiny hybrid checkpoints (numpy backend): the same tokens as the
synchronous engine (recurrent state updated in place by chained steps), and every block and
state slot free at the end, through n > 1, abort and preemption."""

from __future__ import annotations

import numpy as np
import pytest

from atlas_core.api import EagerGraph, EngineArgs, LLMEngine, NumpyBackend, SamplingParams

pytestmark = pytest.mark.timeout(120)


def make_engine(path, flag, **kwargs):
    kwargs = {"num_kv_blocks": 64, "max_num_seqs": 4, "block_size": 8, **kwargs}
    return LLMEngine.from_args(EngineArgs(model=str(path), backend="numpy",
                                          async_scheduling=flag, **kwargs))


PARAMS = [SamplingParams(temperature=0, max_tokens=7, ignore_eos=True),
          SamplingParams(temperature=1.0, seed=3, max_tokens=9, ignore_eos=True, n=2),
          SamplingParams(temperature=0.8, seed=4, max_tokens=6, ignore_eos=True)]


def drive(engine, abort_at=None):
    rng = np.random.default_rng(0)
    for i, p in enumerate(PARAMS):
        engine.add_request(f"r{i}", rng.integers(0, 370, 5 + 7 * i).tolist(), p)
    steps = []
    while engine.has_unfinished_requests():
        if len(steps) == abort_at:
            engine.abort_request("r2")
        steps.append([(o.request_id, [c.new_token_ids for c in o.outputs], o.finished)
                      for o in engine.step()])
    return steps


@pytest.mark.parametrize("kwargs,abort_at", [({}, 3), ({}, None),
                                             ({"num_kv_blocks": 5, "enable_prefix_caching": False}, 3),
                                             ({"num_kv_blocks": 5, "enable_prefix_caching": False}, None)],
                         ids=["abort", "plain", "preempt-abort", "preempt"])
def test_hybrid_async_matches_sync(checkpoints, kwargs, abort_at):
    path = checkpoints["Qwen3_5ForCausalLM"]
    engines = [make_engine(path, flag, **kwargs) for flag in (False, True)]
    runs = [drive(e, abort_at) for e in engines]
    assert runs[0] == runs[1]
    assert engines[1].runner.num_chained_steps > 0
    assert engines[0].scheduler.num_preemptions == engines[1].scheduler.num_preemptions
    assert ("num_kv_blocks" in kwargs) == (engines[1].scheduler.num_preemptions > 0)
    for e in engines:
        assert e.block_manager.num_used_blocks == 0
        assert e.state_cache.num_free_slots == e.state_cache.num_slots


def test_hybrid_mock_chained_steps_allocate_nothing_and_sync_once(checkpoints):
    engine = LLMEngine.from_args(EngineArgs(model=str(checkpoints["Qwen3_5MoeForCausalLM"]),
                                            backend="mock", num_kv_blocks=64, max_num_seqs=4,
                                            block_size=8))
    assert engine.async_scheduling
    backend = engine.backend
    for i in range(3):
        engine.add_request(f"r{i}", [3 + i] * (6 + i), SamplingParams(
            temperature=0.7, seed=i, max_tokens=7, ignore_eos=True))
    engine.step()
    engine.step()
    for _ in range(4):
        with backend.record() as rec:
            assert len(engine.step()) == 3
        kinds = [e.kind for e in rec.events]
        assert rec.count("alloc") == 0, rec.names("alloc")
        assert rec.host_syncs == 1 and kinds.index("graph_launch") < kinds.index("d2h")
        assert rec.count("graph_launch") == 1 and rec.count("launch") == 0
    engine.step()
    assert not engine.has_unfinished_requests()
    assert engine.state_cache.num_free_slots == engine.state_cache.num_slots


class _RunsAtCapture(NumpyBackend):
    """Numpy with graphs whose capture runs the step once, as cuda's does."""

    name = "numpy-capture-runs"

    @property
    def supports_graphs(self) -> bool:
        return True

    def capture(self, fn):
        fn()
        return EagerGraph(fn)


@pytest.mark.parametrize("flag", [False, True])
def test_capture_that_runs_the_step_leaves_state_alone(checkpoints, flag):
    path = checkpoints["Qwen3_5ForCausalLM"]
    args = dict(model=str(path), num_kv_blocks=64, max_num_seqs=4, block_size=8)
    graphs = LLMEngine.from_args(EngineArgs(**args, async_scheduling=flag), backend=_RunsAtCapture())
    eager = LLMEngine.from_args(EngineArgs(**args, backend="numpy"))
    assert drive(graphs) == drive(eager)
    assert graphs.runner.num_graph_replays > 0 and eager.runner.num_graph_replays == 0
