"""Engine hardening (#30): numeric bounds, one request's fault fails it alone, a dead loop is
reported, ``max_waiting`` counts requests without a slot, warm-up and the deep check."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from atlas_core.engine import (AsyncLLMEngine, EngineDeadError, QueueFull, RequestError,
                               SamplingParams)
from atlas_core.engine.sampler import LogitsRow, Sampler
from atlas_core.engine.sequence import Sequence
from atlas_core.testing.fake_model import make_fake_engine

pytestmark = pytest.mark.timeout(60)


def prompt(seed: int, n: int = 4) -> list[int]:
    return [(seed * 3 + i * 5) % 60 + 1 for i in range(n)]


async def collect(aengine, rid, p, params):
    outs = []
    async for out in aengine.generate(rid, p, params):
        outs.append(out)
    return outs


def run(aengine, coro):
    try:
        return asyncio.run(coro)
    finally:
        aengine.shutdown()


class Gate:
    """Holds every model forward of ``engine`` until :meth:`open` (a stuck device)."""

    def __init__(self, engine, is_open: bool = False):
        self.event = threading.Event()
        if is_open:
            self.event.set()
        forward = engine.model.forward

        def gated(input_ids, meta):
            self.event.wait(20)
            return forward(input_ids, meta)
        engine.model.forward = gated

    def open(self):
        self.event.set()

    def close(self):
        self.event.clear()


@pytest.mark.parametrize("kwargs, field", [
    ({"top_k": 2 ** 31}, "top_k"), ({"top_k": 2 ** 70}, "top_k"), ({"top_k": 1.5}, "top_k"),
    ({"n": 129}, "n"), ({"n": True}, "n"), ({"max_tokens": 2 ** 31}, "max_tokens"),
    ({"min_tokens": 2 ** 40, "max_tokens": None}, "min_tokens"),
    ({"temperature": float("nan")}, "temperature"), ({"temperature": float("inf")}, "temperature"),
    ({"top_p": float("nan")}, "top_p"), ({"min_p": float("inf")}, "min_p"),
    ({"repetition_penalty": float("inf")}, "repetition_penalty"),
    ({"presence_penalty": float("nan")}, "presence_penalty"),
    ({"frequency_penalty": float("-inf")}, "frequency_penalty"),
    ({"logit_bias": {3: float("nan")}}, "logit_bias"), ({"logit_bias": {-1: 1.0}}, "logit_bias"),
    ({"seed": 2 ** 64}, "seed"), ({"seed": -5}, "seed"), ({"logprobs": True}, "logprobs"),
    ({"thinking_budget": -1, "thinking_end_token_ids": [5]}, "thinking_budget"),
    ({"thinking_end_token_ids": [-2]}, "thinking_end_token_ids"),
])
def test_out_of_range_numbers_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=rf"^{field} must be"):
        SamplingParams(**kwargs)


def test_top_k_and_token_ids_are_bounded_by_the_vocabulary():
    SamplingParams(top_k=64).validate_vocab(64)
    with pytest.raises(ValueError, match=r"^top_k must be .*\[1, 64\].* got 65"):
        SamplingParams(top_k=65).validate_vocab(64)
    with pytest.raises(ValueError, match=r"^logit_bias must be token ids in \[0, 64\)"):
        SamplingParams(logit_bias={64: 1.0}).validate_vocab(64)


def test_huge_top_k_is_refused_before_it_reaches_the_engine():
    engine = make_fake_engine()
    aengine = AsyncLLMEngine(engine)

    async def main():
        with pytest.raises(ValueError, match="^top_k must be"):
            await collect(aengine, "big", prompt(1),
                          SamplingParams(top_k=engine.model.vocab_size + 1))
        outs = await collect(aengine, "ok", prompt(1), SamplingParams(top_k=5, max_tokens=3))
        return outs[-1]
    last = run(aengine, main())
    assert last.finished and len(last.outputs[0].token_ids) == 3 and not aengine.errored


def test_sampler_clamps_top_k_to_the_vocabulary():
    engine = make_fake_engine()
    vocab = engine.model.vocab_size
    sampler = Sampler(engine.backend, 2, vocab)
    params = SamplingParams(top_k=5)
    params.top_k = 2 ** 40
    sampler.upload_params([LogitsRow(Sequence("r", 0, [1, 2], params, 7))], 2)
    assert sampler.host["top_k"][0] == vocab and sampler.host["top_k"].dtype == np.int32


@pytest.mark.parametrize("method", ["append", "masked_ids"])
def test_a_fault_in_one_sequence_fails_that_request_alone(method):
    engine = make_fake_engine()
    original = getattr(engine.stop_checker, method)

    def faulty(seq, *args):
        if seq.request_id == "bad" and seq.output_token_ids:
            raise RuntimeError("detokenizer blew up")
        return original(seq, *args)
    setattr(engine.stop_checker, method, faulty)
    aengine = AsyncLLMEngine(engine)
    params = SamplingParams(temperature=0, max_tokens=6)

    async def main():
        return await asyncio.gather(*(collect(aengine, rid, prompt(i), params)
                                      for i, rid in enumerate(["a", "bad", "b"])),
                                    return_exceptions=True)
    a, bad, b = run(aengine, main())
    assert isinstance(bad, RequestError)
    assert "request bad" in str(bad) and "RuntimeError" in str(bad)
    assert "blew up" not in str(bad)  # exception text stays in the server log
    assert a[-1].outputs[0].token_ids == engine.model.greedy(prompt(0), 6)
    assert b[-1].outputs[0].token_ids == engine.model.greedy(prompt(2), 6)
    assert not aengine.errored and aengine.stats().num_failed_requests == 1
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    assert not engine.has_unfinished_requests()


def test_a_failed_step_fails_its_requests_and_the_engine_goes_on():
    engine = make_fake_engine()
    execute = engine.runner.execute
    faults = [RuntimeError("injected step fault")]

    def faulty(*args, **kwargs):
        if faults:
            raise faults.pop()
        return execute(*args, **kwargs)
    engine.runner.execute = faulty
    aengine = AsyncLLMEngine(engine)
    params = SamplingParams(temperature=0, max_tokens=4)

    async def main():
        failed = await asyncio.gather(collect(aengine, "x", prompt(1), params),
                                      return_exceptions=True)
        after = await collect(aengine, "y", prompt(2), params)
        return failed[0], after
    failed, after = run(aengine, main())
    assert isinstance(failed, RequestError) and "RuntimeError" in str(failed) and "injected" not in str(failed)
    assert after[-1].outputs[0].token_ids == engine.model.greedy(prompt(2), 4)
    assert not aengine.errored and aengine.stats().is_alive
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_a_request_that_fails_to_add_fails_alone():
    engine = make_fake_engine()
    start = engine.guided.start

    def faulty(seq):
        if seq.request_id == "bad":
            raise TypeError("grammar compiler crashed")
        return start(seq)
    engine.guided.start = faulty
    aengine = AsyncLLMEngine(engine)
    params = SamplingParams(temperature=0, max_tokens=3)

    async def main():
        return await asyncio.gather(collect(aengine, "bad", prompt(1), params),
                                    collect(aengine, "good", prompt(2), params),
                                    return_exceptions=True)
    bad, good = run(aengine, main())
    assert isinstance(bad, RequestError) and "grammar compiler crashed" in str(bad)
    assert good[-1].outputs[0].token_ids == engine.model.greedy(prompt(2), 3)
    assert not engine.groups and not aengine.errored


class Fatal(BaseException):
    """Not an ``Exception``: nothing in the step catches it, so the loop thread dies."""


def test_a_dead_loop_fails_every_stream_and_later_requests():
    engine = make_fake_engine()
    gate = Gate(engine)
    step = engine.step

    def fatal_step():
        if "die" in engine.groups:
            raise Fatal("thread killed")
        return step()
    engine.step = fatal_step
    aengine = AsyncLLMEngine(engine)
    params = SamplingParams(max_tokens=50)

    async def main():
        running = asyncio.create_task(collect(aengine, "running", prompt(1), params))
        while not engine.has_unfinished_requests():
            await asyncio.sleep(0.01)
        dying = asyncio.create_task(collect(aengine, "die", prompt(2), params))
        await asyncio.sleep(0.05)
        gate.open()
        results = await asyncio.gather(running, dying, return_exceptions=True)
        with pytest.raises(EngineDeadError, match="Fatal; details in the server log"):
            await collect(aengine, "late", prompt(3), params)
        return results
    results = run(aengine, main())
    assert all(isinstance(r, EngineDeadError) for r in results)
    assert aengine.errored and "Fatal: thread killed" in aengine.error
    assert not aengine.stats().is_alive


def test_max_waiting_counts_only_requests_without_a_slot():
    engine = make_fake_engine(max_num_seqs=64, num_kv_blocks=256)
    gate = Gate(engine)
    aengine = AsyncLLMEngine(engine, max_waiting=8)
    params = SamplingParams(temperature=0, max_tokens=1)

    async def main():
        tasks = [asyncio.create_task(collect(aengine, f"r{i}", prompt(i), params))
                 for i in range(200)]
        await asyncio.sleep(0.3)
        refused = [t for t in tasks if t.done() and isinstance(t.exception(), QueueFull)]
        gate.open()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        return len(refused), results
    num_refused, results = run(aengine, main())
    served = [r for r in results if not isinstance(r, BaseException)]
    assert num_refused == 200 - 64 - 8
    assert len(served) == 64 + 8 and all(r[-1].finished for r in served)
    assert "max_waiting=8" in str(next(r for r in results if isinstance(r, QueueFull)))


def test_warm_up_runs_a_generation_and_marks_the_engine_warm():
    engine = make_fake_engine()
    aengine = AsyncLLMEngine(engine)
    assert not aengine.is_warm
    seconds = run(aengine, aengine.warm_up())
    stats = aengine.stats()
    assert aengine.is_warm and seconds >= 0
    assert stats.num_generation_tokens >= 2 and stats.num_steps >= 2
    assert not engine.has_unfinished_requests()


def test_check_generates_one_token_or_times_out_on_a_stuck_engine():
    engine = make_fake_engine()
    gate = Gate(engine, is_open=True)
    aengine = AsyncLLMEngine(engine)

    async def main():
        assert await aengine.check(5.0) >= 0
        gate.close()
        with pytest.raises(TimeoutError):
            await aengine.check(0.2)
        gate.open()
        while engine.has_unfinished_requests():
            await asyncio.sleep(0.01)
        return await aengine.check(5.0)
    assert run(aengine, main()) >= 0
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_a_model_default_top_k_above_the_vocabulary_means_off():
    model_engine = make_fake_engine()
    vocab = model_engine.model.vocab_size
    engine = type(model_engine)(model_engine.model, model_engine.backend, model_engine.args,
                                generation_defaults={"top_k": vocab + 50, "temperature": 0.7})
    params = engine.default_sampling_params(max_tokens=2)
    assert params.top_k == 0 and params.temperature == 0.7
    engine.validate_request(prompt(1), params)


def test_snapshots_planned_by_a_failed_step_are_never_published():
    from atlas_core.engine.state_cache import StateCache
    cache = StateCache(num_slots=2, num_snapshots=2)
    a, b = (Sequence(r, 0, [1, 2], SamplingParams(), 0) for r in "ab")
    cache.assign(a)
    cache.assign(b)
    copy_a, copy_b = cache.save(a, b"hash-a"), cache.save(b, b"hash-b")
    cache.cancel([copy_a])
    cache.complete_step()
    assert list(cache.row_of) == [b"hash-b"]
    cache.save(a, b"hash-c")
    b.block_hashes = [b"hash-b"]
    cache.restore(b, 1)
    cache.cancel()
    cache.complete_step()
    assert list(cache.row_of) == [b"hash-b"] and not cache.ref_counts
    assert len(cache.free_rows) == 1
