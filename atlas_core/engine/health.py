"""Warm-up and the deep health check: short generations run through an AsyncLLMEngine.

A server reports healthy only after :func:`warm_up` has run, so one-off costs (numba compiling
the CPU kernels, the CUDA graph of every decode batch-size bucket, NVRTC cache loads) are paid
before the first user request instead of by it. :func:`check` proves the whole path works
(schedule, forward, sample, stream back) within a deadline, for readiness probes that must catch
a stuck or broken engine.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time

from atlas_core.engine.sampling_params import SamplingParams

log = logging.getLogger(__name__)

#: Prompt tokens of the warm-up requests.
WARM_UP_PROMPT_SIZE = 8
#: Tokens each warm-up request generates (a prefill step, then decode steps).
WARM_UP_MAX_TOKENS = 4


def _prompt(engine, size: int, max_tokens: int, offset: int = 0) -> list[int]:
    size = max(1, min(size, engine.max_seq_len - max_tokens))
    vocab = engine.model.vocab_size
    return [(7 * i + 3 * offset + 1) % vocab for i in range(size)]


async def _generate(aengine, prompt: list[int], params: SamplingParams) -> list[int]:
    request_id = f"atlas-health-{secrets.token_hex(6)}"
    tokens: list[int] = []
    async for out in aengine.generate(request_id, prompt, params):
        tokens = list(out.outputs[0].token_ids)
    return tokens


async def warm_up(aengine) -> float:
    """Run two short requests together through ``aengine``: one with the model's default
    sampling settings and one greedy, so prefill, batched decode and both sampling paths have
    run once.

    Args:
        aengine: an :class:`~atlas_core.engine.AsyncLLMEngine`; its ``is_warm`` turns true.

    Returns:
        The seconds it took.

    Raises:
        Exception: whatever the engine raised (the server reports it through ``/health``).
    """
    engine = aengine.engine
    start = time.monotonic()
    max_tokens = max(1, min(WARM_UP_MAX_TOKENS, engine.max_seq_len - 1))
    sampled = engine.default_sampling_params(max_tokens=max_tokens, ignore_eos=True, seed=0)
    greedy = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    await asyncio.gather(
        _generate(aengine, _prompt(engine, WARM_UP_PROMPT_SIZE, max_tokens), sampled),
        _generate(aengine, _prompt(engine, WARM_UP_PROMPT_SIZE, max_tokens, offset=1), greedy))
    await warm_graph_buckets(aengine)
    aengine.is_warm = True
    return time.monotonic() - start


def bucket_schedule(buckets: list[int], limit: int) -> list[int]:
    """``max_tokens`` of each warm-up request so that, after their shared prefill step, the
    decode steps run exactly the batch sizes of ``buckets`` (the largest first, one step each):
    the request of rank ``r`` (1-based) lives through every bucket of at least ``r`` sequences.
    ``limit`` caps the requests (KV blocks, admission queue); larger buckets are left out."""
    usable = [b for b in buckets if b <= limit]
    if not usable:
        return []
    return [1 + sum(b >= r for b in usable) for r in range(1, max(usable) + 1)]


async def warm_graph_buckets(aengine) -> None:
    """Capture the decode graph of every batch-size bucket before the server reports ready (a
    first 32-way wave once took 14.4 s on a fresh H200 against 1.2 s warm): one greedy request
    per sequence of the largest bucket, ending so that each bucket's size decodes once. With
    speculation on, the first of those steps also captures the verify graph of every bucket a
    verify step can take (over padding inputs: drafts of random prompts may never come). Nothing
    to do on a backend without graphs."""
    engine = aengine.engine
    runner = engine.runner
    buckets = list(getattr(runner, "buckets", ()) or ())
    if not buckets or not getattr(runner, "use_graphs", False):
        return
    per_seq = -(-(WARM_UP_PROMPT_SIZE + len(buckets) + 2) // engine.args.block_size)
    limit = min(engine.args.max_num_seqs, engine.block_manager.num_blocks // max(per_seq, 1),
                engine.args.max_waiting or engine.args.max_num_seqs,
                engine.args.max_prefill_tokens // WARM_UP_PROMPT_SIZE,
                getattr(engine.kv_config, "num_state_slots", 0) or engine.args.max_num_seqs)
    schedule = bucket_schedule(buckets, limit)
    if not schedule:
        return
    if getattr(runner, "verify", None) is not None:
        runner.warm_verify_graphs()
    log.info("warm-up: capturing the decode graphs of %d batch sizes (up to %d sequences)",
             sum(b <= limit for b in buckets), len(schedule))
    await aengine.gather_together([
        _generate(aengine, _prompt(engine, WARM_UP_PROMPT_SIZE, n, offset=2 + i),
                  SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True))
        for i, n in enumerate(schedule)])


async def check(aengine, timeout: float) -> float:
    """Generate one greedy token through ``aengine`` within ``timeout`` seconds.

    The request queues like any other, so on a saturated server it also measures the wait.

    Returns:
        The seconds it took.

    Raises:
        TimeoutError: no token within ``timeout`` (the request is aborted).
        EngineDeadError, QueueFull, RequestError: as :meth:`AsyncLLMEngine.generate`.
        RuntimeError: the engine returned no token or one outside the vocabulary.
    """
    engine = aengine.engine
    start = time.monotonic()
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    tokens = await asyncio.wait_for(_generate(aengine, _prompt(engine, 4, 1), params), timeout)
    if len(tokens) != 1 or not 0 <= tokens[0] < engine.model.vocab_size:
        raise RuntimeError(f"the engine returned {tokens!r} for a one-token request")
    return time.monotonic() - start
