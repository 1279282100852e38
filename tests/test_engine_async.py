"""AsyncLLMEngine: concurrent streams, cancellation frees blocks, errors reach every consumer."""

import asyncio
import threading
import time

import pytest

from atlas_core.engine import (AsyncLLMEngine, EngineDeadError, QueueFull, RequestError,
                               SamplingParams)
from atlas_core.engine.llm_engine import MAX_CONSECUTIVE_FAILURES
from atlas_core.testing.fake_model import make_fake_engine

pytestmark = pytest.mark.timeout(30)


def prompt(seed, n):
    return [(seed * 3 + i * 5) % 60 + 1 for i in range(n)]


async def collect(engine, rid, p, params):
    outs = []
    async for out in engine.generate(rid, p, params):
        outs.append(out)
    return outs


async def wait_until(cond, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


def test_concurrent_requests_stream_correct_tokens():
    engine = make_fake_engine()
    aengine = AsyncLLMEngine(engine)

    async def main():
        params = SamplingParams(temperature=0, max_tokens=8)
        return await asyncio.gather(*(collect(aengine, f"r{i}", prompt(i, 5 + i), params)
                                      for i in range(5)))
    try:
        results = asyncio.run(main())
    finally:
        aengine.shutdown()
    for i, outs in enumerate(results):
        assert outs[-1].finished and not any(o.finished for o in outs[:-1])
        tokens = [t for o in outs for t in o.outputs[0].new_token_ids]
        assert tokens == outs[-1].outputs[0].token_ids == engine.model.greedy(prompt(i, 5 + i), 8)
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_cancelled_consumer_aborts_and_frees_blocks():
    engine = make_fake_engine()
    aengine = AsyncLLMEngine(engine)

    async def main():
        got_one = asyncio.Event()

        async def consume():
            async for _ in aengine.generate("long", prompt(1, 40), SamplingParams(max_tokens=400)):
                got_one.set()
        task = asyncio.create_task(consume())
        await got_one.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await wait_until(lambda: not engine.has_unfinished_requests())
        await wait_until(lambda: aengine.stats().num_kv_blocks_used == 0)
    try:
        asyncio.run(main())
    finally:
        aengine.shutdown()
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_abort_ends_stream_with_abort_reason():
    engine = make_fake_engine()
    aengine = AsyncLLMEngine(engine)

    async def main():
        outs = []
        async for out in aengine.generate("a", prompt(2, 5), SamplingParams(max_tokens=400)):
            outs.append(out)
            if len(outs) == 2:
                await aengine.abort("a")
        return outs
    try:
        outs = asyncio.run(main())
    finally:
        aengine.shutdown()
    assert outs[-1].finished and outs[-1].outputs[0].finish_reason == "abort"


class Boom(RuntimeError):
    pass


def test_engine_error_reaches_every_waiting_request():
    engine = make_fake_engine()
    forward = engine.model.forward
    calls = []

    def failing(input_ids, meta):
        calls.append(1)
        if len(calls) > 3:
            raise Boom("device fell over")
        return forward(input_ids, meta)
    engine.model.forward = failing
    aengine = AsyncLLMEngine(engine)

    async def main():
        params = SamplingParams(max_tokens=50)
        results = await asyncio.gather(*(collect(aengine, f"r{i}", prompt(i, 4), params)
                                         for i in range(3)), return_exceptions=True)
        late = [await asyncio.gather(collect(aengine, f"late{i}", prompt(1, 4), params),
                                     return_exceptions=True)
                for i in range(MAX_CONSECUTIVE_FAILURES - 1)]
        with pytest.raises(EngineDeadError):
            await collect(aengine, "later", prompt(1, 4), params)
        return results, late
    try:
        results, late = asyncio.run(main())
    finally:
        aengine.shutdown()
    assert all(isinstance(r, RequestError) and "device fell over" not in str(r) for r in results)
    assert isinstance(late[0][0], RequestError) and isinstance(late[-1][0], EngineDeadError)
    assert "Boom" in str(late[-1][0]) and "device fell over" not in str(late[-1][0])
    assert aengine.errored


def test_invalid_request_raises_before_queueing():
    aengine = AsyncLLMEngine(make_fake_engine())

    async def main():
        with pytest.raises(ValueError, match="prompt is empty"):
            await collect(aengine, "bad", [], SamplingParams())
    try:
        asyncio.run(main())
    finally:
        aengine.shutdown()


def test_bounded_waiting_queue_raises_queue_full():
    engine = make_fake_engine(max_num_seqs=1)
    gate = threading.Event()
    forward = engine.model.forward

    def gated(input_ids, meta):
        gate.wait(10)
        return forward(input_ids, meta)
    engine.model.forward = gated
    aengine = AsyncLLMEngine(engine, max_waiting=1)

    async def main():
        params = SamplingParams(temperature=0, max_tokens=2)
        first = asyncio.create_task(collect(aengine, "a", prompt(1, 4), params))
        await wait_until(lambda: engine.has_unfinished_requests())
        second = asyncio.create_task(collect(aengine, "b", prompt(2, 4), params))
        await asyncio.sleep(0.05)
        with pytest.raises(QueueFull, match="max_waiting=1"):
            await collect(aengine, "c", prompt(3, 4), params)
        gate.set()
        return await first, await second
    try:
        a, b = asyncio.run(main())
    finally:
        gate.set()
        aengine.shutdown()
    assert a[-1].finished and b[-1].finished
