"""The step description the engine sends every worker: the scheduler's plan and the logits
rows, with each sequence reduced to what a model runner reads (no request group, stop state or
detokenizer; only the step's window of tokens unless its sampling reads the whole history; a
request's images travel only with the steps whose tokens read them — ``Sequence.mm.for_step``
— and every rank encodes them itself, keeping nothing between steps), so every worker runs
exactly the single-GPU :class:`ModelRunner` step.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from atlas_core.engine.sequence import Sequence

#: Sequence fields only the engine's host side uses (never a model runner or sampler).
_ENGINE_ONLY = frozenset({"group", "stop_state", "logprobs", "block_hashes"})


class UnsupportedInParallel(ValueError):
    """A request asks for something the parallel engine does not run yet."""


@dataclass
class StepDescription:
    """One step for every worker: ``(sched, rows_of)`` as ``ModelRunner.execute`` takes them.

    Attributes:
        sched: the :class:`~atlas_core.engine.scheduler.SchedulerOutput`, sequences reduced.
        rows_of: ``seq_id -> [LogitsRow]``, sequences reduced.
    """

    sched: Any
    rows_of: dict[int, list[Any]]


class _Count:
    """Stands in for a token list whose length is all a step reads (the sampler's step
    counter)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n


class WindowSequence(Sequence):
    """A sequence reduced to the tokens one step reads (``start .. start + num_tokens``), so
    the step description stays small at long contexts. In a step where some sequence's sampling
    reads its whole history (penalties, logits filters) every sequence travels whole instead."""

    def __init__(self, seq: Sequence, start: int, stop: int) -> None:
        self.__dict__.update({k: v for k, v in seq.__dict__.items() if k not in _ENGINE_ONLY})
        self.group = None
        self.window_start, self.window = start, seq.tokens_range(start, stop)
        self.length = len(seq)
        self.prompt_token_ids = _Count(len(seq.prompt_token_ids))
        self.output_token_ids = _Count(len(seq.output_token_ids))

    def __len__(self) -> int:
        return self.length

    def token_id_at(self, i: int) -> int:
        return self.window[i - self.window_start]

    def tokens_range(self, start: int, stop: int) -> list[int]:
        return self.window[start - self.window_start:stop - self.window_start]


def _reads_history(seq: Sequence) -> bool:
    return seq.params.has_penalties or seq.params.has_logits_filters


def _reduced(s: Any, cache: dict[int, Sequence], whole: bool) -> Sequence:
    seq = s.seq
    if seq.seq_id not in cache:
        if whole:
            light = Sequence.__new__(Sequence)
            light.__dict__.update({k: v for k, v in seq.__dict__.items()
                                   if k not in _ENGINE_ONLY})
            light.group = None
        else:
            light = WindowSequence(seq, s.start, s.start + s.num_tokens)
        for_step = getattr(seq.mm, "for_step", None)
        if for_step is not None:
            light.mm = for_step(s.start, s.num_tokens)
        cache[seq.seq_id] = light
    return cache[seq.seq_id]


def describe_step(sched: Any, rows_of: dict[int, list[Any]]) -> StepDescription:
    """The picklable description of one engine step.

    Raises:
        UnsupportedInParallel: a row needs guided decoding (its grammar matcher lives in the
            engine process; not run across GPUs yet).
    """
    cache: dict[int, Sequence] = {}
    # the sampler pads every row's history as soon as one row reads its own
    whole = any(_reads_history(s.seq) for s in sched.scheduled)
    scheduled = [replace(s, seq=_reduced(s, cache, whole)) for s in sched.scheduled]
    rows = {}
    for seq_id, seq_rows in rows_of.items():
        for r in seq_rows:
            if r.matcher is not None:
                raise UnsupportedInParallel(
                    "guided decoding (response_format, grammars, strict tools) is not supported "
                    "with --tensor-parallel-size > 1 yet; serve on one GPU for it")
        rows[seq_id] = [replace(r, seq=cache[r.seq.seq_id]) for r in seq_rows]
    return StepDescription(replace(sched, scheduled=scheduled, preempted=[]), rows)
