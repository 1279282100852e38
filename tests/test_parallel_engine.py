"""Tensor and expert parallelism end to end on the numpy backend: two worker processes joined
by the ``cpu`` comm backend give the single-process greedy tokens (and logprobs within float32
rounding: the partial sums are added in another order); a killed worker fails the engine fast
and leaves no process behind."""

import os
import signal
import time

import pytest

from atlas_core.engine import EngineArgs, LLMEngine, SamplingParams
from atlas_core.parallel.executor import WorkerLostError
from atlas_core.testing.checkpoints import write_tiny_checkpoint
from atlas_core.testing.parallel import finished_tokens

PROMPTS = [[1, 2, 3, 4, 5, 6, 7], [9, 8, 7]]
LOGPROB_ATOL = 1e-4


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    # dense: vocab 381 pads the last rank's vocabulary shard and its one KV head is replicated
    # on both ranks; moe: its two KV heads are split
    return {"dense": write_tiny_checkpoint("Qwen3ForCausalLM", tmp_path_factory.mktemp("q3"),
                                           vocab_size=381, num_key_value_heads=1),
            "moe": write_tiny_checkpoint("Qwen3MoeForCausalLM", tmp_path_factory.mktemp("moe"))}


def _engine(path, tp=1, ep=False, async_scheduling=None):
    return LLMEngine.from_args(EngineArgs(model=str(path), backend="numpy", num_kv_blocks=48,
                                          max_num_seqs=4, tensor_parallel_size=tp,
                                          enable_expert_parallel=ep, distributed_timeout=60,
                                          async_scheduling=async_scheduling))


def _generate(engine, max_tokens=6, logprobs=1):
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True,
                            logprobs=logprobs)
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(f"r{i}", prompt, params)
    # penalties read the whole history: this one travels to the workers whole
    engine.add_request("penalised", PROMPTS[0], SamplingParams(
        temperature=0, max_tokens=max_tokens, ignore_eos=True, logprobs=logprobs,
        repetition_penalty=1.5))
    return finished_tokens(engine)


def _assert_same(parallel, single):
    assert {k: v[0] for k, v in parallel.items()} == {k: v[0] for k, v in single.items()}
    for k in single:
        assert parallel[k][1] == pytest.approx(single[k][1], abs=LOGPROB_ATOL)


@pytest.fixture(scope="module")
def tp_engine(checkpoints):
    engine = _engine(checkpoints["dense"], tp=2, async_scheduling=True)
    yield engine
    engine.runner.shutdown()


def test_tensor_parallel_matches_single_process(checkpoints, tp_engine):
    assert tp_engine.backend.name == "numpy x2"
    single = _engine(checkpoints["dense"])
    _assert_same(_generate(tp_engine), _generate(single))
    # without logprobs, decode steps are chained on the workers (async scheduling)
    chained = _generate(tp_engine, max_tokens=10, logprobs=None)
    assert tp_engine.num_consecutive_failures == 0
    assert chained == _generate(single, max_tokens=10, logprobs=None)


def test_expert_parallel_matches_single_process(checkpoints):
    engine = _engine(checkpoints["moe"], tp=2, ep=True)
    try:
        parallel = _generate(engine)
    finally:
        engine.runner.shutdown()
    _assert_same(parallel, _generate(_engine(checkpoints["moe"])))
    assert all(not p.is_alive() for p in engine.runner._procs)


def test_killed_worker_fails_the_engine_and_stops_the_others(tp_engine):
    params = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
    tp_engine.add_request("long", PROMPTS[0], params)
    tp_engine.step()
    failures = []
    tp_engine.runner.set_failure_handler(failures.append)
    os.kill(tp_engine.runner._procs[1].pid, signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(WorkerLostError, match="worker|rank 1"):
        while tp_engine.has_unfinished_requests():
            tp_engine.step()
    assert time.monotonic() - start < 20
    assert len(failures) == 1 and isinstance(failures[0], WorkerLostError)
    deadline = time.monotonic() + 15
    while any(p.is_alive() for p in tp_engine.runner._procs) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(p.is_alive() for p in tp_engine.runner._procs)


def test_a_model_that_does_not_split_fails_before_any_worker_starts(checkpoints):
    from atlas_core.parallel.sharding import ShardingError
    start = time.monotonic()
    with pytest.raises(ShardingError, match="num_attention_heads .4. is not divisible by "
                                            "--tensor-parallel-size 3"):
        _engine(checkpoints["dense"], tp=3)
    with pytest.raises(ValueError, match="--kv-host-gb / --kv-offload-dir are not supported"):
        LLMEngine.from_args(EngineArgs(model=str(checkpoints["dense"]), backend="numpy",
                                       tensor_parallel_size=2, kv_host_gb=1.0))
    assert time.monotonic() - start < 5
