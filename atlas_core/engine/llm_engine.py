"""LLMEngine: requests in, one scheduler + model step at a time, RequestOutputs out."""

from __future__ import annotations

import logging
import random
import time
from typing import Any, Callable

from atlas_core.engine.agent_guards import AgentGuards
from atlas_core.engine.args import EngineArgs
from atlas_core.engine.block_manager import BlockManager
from atlas_core.engine.fault_isolation import FaultIsolation
from atlas_core.engine.kv_sizing import plan_kv_cache
from atlas_core.engine.kv_tier_setup import create_kv_tiers, with_tier_stats
from atlas_core.engine.model_runner import ModelRunner, PendingStep
from atlas_core.engine.overlap import OverlapPolicy
from atlas_core.engine.outputs import EngineStats, RequestMetrics, RequestOutput
from atlas_core.engine.request_checks import check_request
from atlas_core.engine.sampler import LogitsRow
from atlas_core.engine.sampling_params import SamplingParams
from atlas_core.engine.sampling_presets import defaults_for, model_presets
from atlas_core.engine.scheduler import Scheduler, SchedulerOutput
from atlas_core.engine.scheduling_policy import create_scheduling_policy
from atlas_core.engine.sequence import Sequence, SequenceGroup
from atlas_core.engine.spec.setup import create_speculator, prepare_model
from atlas_core.engine.state_cache import StateCache
from atlas_core.engine.step_timing import DecodeStepTimer
from atlas_core.engine.stop import StopChecker
from atlas_core.engine.thinking import ThinkingBudgets
from atlas_core.engine.window_blocks import WindowedBlockManager
from atlas_core.guided.sequences import GuidedSequences

log = logging.getLogger(__name__)

#: Steps failing in a row before :meth:`LLMEngine.step` gives up and raises (the device or
#: the engine's own state is broken, not one request).
MAX_CONSECUTIVE_FAILURES = 3


def sibling_seed(seed: int, index: int) -> int:
    """Seed of completion ``index`` of a request seeded with ``seed`` (index 0 keeps it)."""
    if index == 0:
        return seed
    return (seed * 0x9E3779B97F4A7C15 + index * 0xBF58476D1CE4E5B9) % (1 << 63)


class LLMEngine(FaultIsolation):
    """Continuous-batching engine over one model.

    Not thread-safe: one thread calls ``add_request`` / ``abort_request`` / ``step`` (the
    :class:`~atlas_core.engine.AsyncLLMEngine` runs them on its own thread).

    Args:
        model: a loaded CausalLM.
        backend: its GpuBackend.
        args: engine settings.
        tokenizer: for text output and stop strings (``None``: token ids only).
        eos_token_ids: ids ending generation (default: the tokenizer's).
        detokenizer_factory: ``(prompt_ids, skip_special_tokens) -> detokenizer`` (default:
            :class:`~atlas_core.tokenizer.IncrementalDetokenizer` over ``tokenizer``).
        generation_defaults: ``temperature`` / ``top_p`` / ``top_k`` / ``min_p`` /
            ``repetition_penalty`` from generation_config.json.
        executor: runs the steps in place of a ModelRunner, with its own ``kv_config`` (the
            workers of a tensor-parallel run, :mod:`atlas_core.parallel.executor`).
    """

    def __init__(self, model, backend, args: EngineArgs, *, tokenizer=None,
                 eos_token_ids: set[int] | None = None,
                 detokenizer_factory: Callable[[list[int], bool], Any] | None = None,
                 generation_defaults: dict | None = None, executor: Any = None) -> None:
        self.model, self.backend, self.args, self.tokenizer = model, backend, args, tokenizer
        if args.batch_invariant:  # again for engines built on a backend made elsewhere (bench)
            backend.set_batch_invariant(True)
            log.info("batch-invariant mode on (%s backend): outputs of a request do not depend "
                     "on the rest of the batch", getattr(backend, "name", backend))
        prepare_model(model, args.speculative_config)
        self.kv_config = (executor.kv_config if executor is not None
                          else plan_kv_cache(backend, model, args))
        self.max_seq_len = self.kv_config.max_seq_len
        if self.kv_config.window_pool is None:
            self.block_manager = BlockManager(self.kv_config.num_blocks, args.block_size,
                                              args.enable_prefix_caching)
        else:
            self.block_manager = WindowedBlockManager(self.kv_config.num_blocks, args.block_size,
                                                      args.enable_prefix_caching,
                                                      self.kv_config.window_pool)
        kv = self.kv_config
        self.state_cache = (StateCache(kv.num_state_slots, kv.num_state_snapshots)
                            if kv.num_state_slots else None)
        policy = create_scheduling_policy(args.scheduling_policy, args.tbt_deadline_ms,
                                          args.admission_age_cap_ms)
        self.scheduler = Scheduler(self.block_manager, args.max_num_seqs, args.max_batch_size,
                                   args.max_prefill_tokens, self.state_cache, policy)
        self.runner = executor if executor is not None else ModelRunner(
            model, backend, self.kv_config, args.max_batch_size, args.max_prefill_tokens,
            self.max_seq_len)
        self.kv_tiers = create_kv_tiers(args, model, self.runner, self.scheduler)
        if eos_token_ids is None:
            eos_token_ids = set(getattr(tokenizer, "eos_token_ids", ()) or ())
        if detokenizer_factory is None and tokenizer is not None:
            from atlas_core.tokenizer import IncrementalDetokenizer

            def detokenizer_factory(prompt_ids, skip):
                return IncrementalDetokenizer(tokenizer, prompt_ids, skip_special_tokens=skip)
        self.stop_checker = StopChecker(eos_token_ids, self.max_seq_len, detokenizer_factory)
        self.speculator = create_speculator(args.speculative_config, model, self.runner,
                                            self.block_manager, self.max_seq_len,
                                            self.stop_checker.masked_ids,
                                            lambda seq: self.thinking.num_unforced(seq))
        self.generation_defaults = dict(generation_defaults or {})
        top_k = self.generation_defaults.get("top_k")
        if isinstance(top_k, int) and top_k > model.vocab_size:
            self.generation_defaults["top_k"] = 0  # keeping every token is what it asks for
        self.generation_defaults["presets"] = model_presets(model, args.sampling_presets)
        self.runner.sampler.encode = tokenizer.encode if tokenizer is not None else None
        self.agent_guards = AgentGuards(args.max_identical_tool_calls, args.max_tool_calls,
                                        args.reasoning_loop_guard)
        self.thinking = ThinkingBudgets()
        self.guided = GuidedSequences(tokenizer, model.vocab_size)
        self.groups: dict[str, SequenceGroup] = {}
        self._rng = random.Random(args.seed)
        self._stats = EngineStats()
        self.async_scheduling = (backend.supports_graphs if args.async_scheduling is None
                                 else bool(args.async_scheduling)) and self.speculator is None
        self.overlap = OverlapPolicy(self.scheduler, self.max_seq_len)
        self._inflight: PendingStep | None = None
        self._planned: list[SchedulerOutput] = []
        self._failed: list[RequestOutput] = []
        self.num_consecutive_failures = 0
        self.decode_timer = DecodeStepTimer(model, self.kv_config)

    @classmethod
    def from_args(cls, args: EngineArgs, backend=None) -> "LLMEngine":
        """Load the backend, model and tokenizer named by ``args`` and size the KV cache.

        ``backend`` (a GpuBackend instance or name) overrides ``args.backend``.
        """
        if args.tensor_parallel_size > 1:
            from atlas_core.parallel.launch import create_parallel_engine
            return create_parallel_engine(cls, args)
        from atlas_core.engine.loading import load_engine_parts
        parts = load_engine_parts(args, backend)
        return cls(parts.model, parts.backend, args, tokenizer=parts.tokenizer,
                   generation_defaults=parts.generation_defaults)

    def default_sampling_params(self, mode: str | None = None, **overrides: Any) -> SamplingParams:
        """SamplingParams with the model's generation_config defaults, the preset of ``mode``
        (:mod:`~atlas_core.engine.sampling_presets`), then ``overrides``."""
        d = self.generation_defaults
        return SamplingParams(**{**defaults_for(d, d["presets"], mode), **overrides})

    # Requests

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                    arrival_time: float | None = None, mm_inputs: Any = None) -> None:
        """Queue a request.

        ``mm_inputs`` is the prompt's multimodal payload (``Sequence.mm``), built by the model
        family's processor over the same, placeholder-expanded, ``prompt_token_ids``.

        Raises:
            ValueError: duplicate id, empty prompt, token ids out of range, or a prompt +
                ``max_tokens`` longer than ``max_seq_len`` (the message gives the numbers).
        """
        if request_id in self.groups:
            raise ValueError(f"request id {request_id!r} is already running; use a unique id")
        prompt = [int(t) for t in prompt_token_ids]
        self.validate_request(prompt, params)
        seed = params.seed if params.seed is not None else self._rng.getrandbits(63)
        group = SequenceGroup(request_id, prompt, params, [], RequestMetrics(arrival_time or time.time()))
        if params.prompt_logprobs is not None:
            group.prompt_logprobs = [None] * len(prompt)
        for i in range(params.n):
            seq = Sequence(request_id, i, prompt, params, sibling_seed(seed, i), group)
            seq.mm = mm_inputs
            self.stop_checker.start(seq)
            self.guided.start(seq)
            group.seqs.append(seq)
        self.groups[request_id] = group
        self.scheduler.add(group.seqs[0])
        if self.args.enable_prefix_caching and params.n > 1:
            group.pending = group.seqs[1:]
        else:
            for seq in group.seqs[1:]:
                self.scheduler.add(seq)

    def validate_request(self, prompt: list[int], params: SamplingParams) -> None:
        """Raise ``ValueError`` (one line, how to fix it) when the request cannot be served."""
        check_request([int(t) for t in prompt], params, vocab_size=self.model.vocab_size,
                      guided=self.guided, max_seq_len=self.max_seq_len,
                      has_detokenizer=self.stop_checker.detokenizer_factory is not None)

    def abort_request(self, request_id: str) -> RequestOutput | None:
        """Stop a request now and free its KV blocks; returns its final output (None if unknown)."""
        group = self.groups.pop(request_id, None)
        if group is None:
            return None
        for seq in group.seqs:
            if not seq.is_finished:
                self.scheduler.finish(seq)
                self.stop_checker.abort(seq)
            self.thinking.forget(seq)
            self.guided.forget(seq)
        group.pending = []
        group.metrics.finish_time = time.time()
        return group.output()

    def has_unfinished_requests(self) -> bool:
        """Whether some added request has not finished (nor been aborted) yet."""
        return bool(self.groups)

    # Stepping

    def step(self) -> list[RequestOutput]:
        """Run one scheduler + model step; return the requests that got tokens or finished.

        With async scheduling a decode step is launched before the previous one's tokens are
        read (see :mod:`atlas_core.engine.overlap`); each call still returns one step's tokens.

        An exception while handling one sequence fails its request alone; one while running
        the whole step fails the requests of that step. Either way their outputs come back
        finished with ``finish_reason="error"`` and :attr:`RequestOutput.error` set, and the
        engine goes on.

        Raises:
            Exception: the error of the last of :data:`MAX_CONSECUTIVE_FAILURES` steps that
                failed in a row.
        """
        self._planned = []
        try:
            outputs = self._step()
        except Exception as exc:
            self.num_consecutive_failures += 1
            if (self.num_consecutive_failures >= MAX_CONSECUTIVE_FAILURES
                    or getattr(exc, "fatal", False)):
                raise
            log.exception("engine step failed; failing the requests it was running")
            self._fail_step(exc)
            outputs = []
        else:
            self.num_consecutive_failures = 0
        failed, self._failed = self._failed, []
        return failed + outputs

    def _step(self) -> list[RequestOutput]:
        if self._inflight is not None and all(s.seq.is_finished for s in self._inflight.sched.scheduled):
            self._inflight.results()
            self._inflight = None
        if self._inflight is not None:
            return self._step_overlapped()
        sched = self.scheduler.schedule()
        self._planned.append(sched)
        if self.speculator is not None:
            self.speculator.plan(sched)
        if not sched.scheduled:
            for group in self.groups.values():
                self._release(group)
            return []
        rows_of, failed_slots = {}, set()
        for s in sched.scheduled:
            try:
                rows = self._rows(s.seq, s.start, s.num_tokens, s.samples)
                rows_of[s.seq.seq_id] = (rows + self.speculator.rows(s, rows[-1])
                                         if s.draft_token_ids else rows)
            except Exception as exc:  # noqa: BLE001 - one request's fault fails it alone
                failed_slots.add(s.seq.state_slot)
                self._fail_seq(s.seq, exc)
        if failed_slots:
            self._drop_failed(sched, failed_slots)
        if not sched.scheduled:
            return []
        self._begin(sched)
        if self.async_scheduling and self.overlap.can_launch(sched, rows_of):
            rows = [rows_of[s.seq.seq_id][0] for s in sched.scheduled]
            self._inflight = self.runner.launch_decode(sched, rows)
            return self._step_overlapped()
        started = time.perf_counter()
        results = self.runner.execute(sched, rows_of)
        if self.kv_tiers is not None:
            self.kv_tiers.on_step(sched, time.perf_counter() - started)
        if self.speculator is None:
            self.scheduler.complete_step(sched)
            return self._complete(sched, results)
        results = self.speculator.select(sched, results)
        self.scheduler.complete_step(sched)
        outputs = self._complete(sched, results)
        self.speculator.settle()
        return outputs

    def _step_overlapped(self) -> list[RequestOutput]:
        # Launch step N+1 (when it may run ahead), then read and finish step N meanwhile.
        prev, self._inflight = self._inflight, None
        self._planned.append(prev.sched)
        nxt = self.overlap.plan_next(prev.sched)
        if nxt is not None:
            self._planned.append(nxt)
            self._begin(nxt)
            self._inflight = self.runner.launch_decode(nxt, [LogitsRow(s.seq) for s in nxt.scheduled],
                                                       prev)
        results = prev.results()
        self.scheduler.complete_step(prev.sched)
        return self._complete(prev.sched, results)

    def _begin(self, sched: SchedulerOutput) -> None:
        now = time.time()
        self._stats.num_steps += 1
        for s in sched.scheduled:
            group = s.seq.group
            if group.metrics.first_scheduled_time is None:
                group.metrics.first_scheduled_time = now
            if s.start < s.seq.num_prompt_tokens:
                self._stats.num_prompt_tokens += min(s.start + s.num_tokens, s.seq.num_prompt_tokens) - s.start

    def _complete(self, sched: SchedulerOutput, results) -> list[RequestOutput]:
        # Tokens of sequences finished since the step was planned (abort, or a stop in the
        # previous step's token under async scheduling) are dropped unseen.
        self.decode_timer.on_complete(sched)
        touched: dict[str, SequenceGroup] = {}
        for res in results:
            seq, group = res.row.seq, res.row.seq.group
            if seq.is_finished:
                continue
            if not res.row.samples:
                group.prompt_logprobs[res.row.position + 1] = res.logprob
                continue
            try:
                self._accept(seq, res.token_id, res.logprob)
            except Exception as exc:  # noqa: BLE001 - one request's fault fails it alone
                self._fail_seq(seq, exc)
                continue
            touched[group.request_id] = group
        self._release_pending(sched)
        return [self._finish_step_output(g) for g in touched.values()
                if g.request_id in self.groups]

    def _rows(self, seq: Sequence, start: int, num_tokens: int, samples: bool) -> list[LogitsRow]:
        rows = []
        group = seq.group
        if group.prompt_logprobs is not None and seq.index == 0 and not seq.output_token_ids:
            end = min(start + num_tokens, seq.num_prompt_tokens - 1)
            rows = [LogitsRow(seq, samples=False, target=seq.prompt_token_ids[p + 1], position=p)
                    for p in range(start, end)]
        if samples:
            rows.append(LogitsRow(seq, stop_ids=self.stop_checker.masked_ids(seq),
                                  matcher=self.guided.matcher(seq)))
        return rows

    def _accept(self, seq: Sequence, token_id: int, logprob) -> None:
        group = seq.group
        if group.metrics.first_token_time is None:
            group.metrics.first_token_time = time.time()
        token_id, logprob = self.thinking.next_token(seq, token_id, logprob)
        if seq.logprobs is not None and logprob is not None:
            seq.logprobs.append(logprob)
        self.stop_checker.append(seq, token_id)
        if seq.finish_reason is None and self.guided.accept(seq, token_id):
            self.stop_checker.finish(seq)
        if seq.finish_reason is None and seq.params.agent_guards is not None:
            self.agent_guards.apply(seq, self.stop_checker)
        self._stats.num_generation_tokens += 1
        if seq.finish_reason is not None:
            self.scheduler.finish(seq)
            self.thinking.forget(seq)
            self.guided.forget(seq)
            self.agent_guards.forget(seq)

    def _release_pending(self, sched: SchedulerOutput) -> None:
        # Siblings of an n > 1 request start once the first has cached the prompt's blocks.
        for s in sched.scheduled:
            if s.seq is s.seq.group.seqs[0] and s.seq.output_token_ids:
                self._release(s.seq.group)

    def _release(self, group: SequenceGroup) -> None:
        for seq in reversed(group.pending):
            self.scheduler.add(seq, front=True)
        group.pending = []

    def _finish_step_output(self, group: SequenceGroup) -> RequestOutput:
        out = group.output()
        if out.finished:
            group.metrics.finish_time = time.time()
            self.groups.pop(group.request_id, None)
        return out

    def stats(self) -> EngineStats:
        """Current gauges and counters."""
        s = self._stats
        bm = self.block_manager
        s.num_running = len(self.scheduler.running)
        s.num_waiting = len(self.scheduler.waiting) + sum(len(g.pending) for g in self.groups.values())
        s.num_kv_blocks_used, s.num_kv_blocks_total = bm.num_used_blocks, bm.num_blocks
        s.prefix_cache_hits, s.prefix_cache_queries = bm.num_hit_tokens, bm.num_query_tokens
        s.num_preemptions = self.scheduler.num_preemptions
        if self.speculator is not None:
            s.speculative = self.speculator.snapshot()
        return with_tier_stats(self.decode_timer.annotate(EngineStats(**vars(s))), self.kv_tiers)
