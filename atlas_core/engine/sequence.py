"""Sequence (one completion being generated) and SequenceGroup (one request, n completions)."""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, field
from typing import Any

from atlas_core.engine.outputs import (CompletionOutput, Prefix, RequestMetrics, RequestOutput,
                                       TokenLogprob)
from atlas_core.engine.sampling_params import SamplingParams

_seq_ids = itertools.count()


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    """The token stream of one completion and its KV-cache bookkeeping.

    ``num_computed_tokens`` tokens of :attr:`token_ids` have their KV in the blocks of
    :attr:`block_table`; the scheduler advances it by prefill chunks and decode steps. After a
    preemption it drops to 0 and the whole stream (prompt + generated tokens) is recomputed.
    On hybrid models :attr:`state_slot` is its recurrent-state slot while running (else ``-1``).
    With a sliding-window pool (:mod:`atlas_core.engine.window_blocks`),
    :attr:`window_block_table` holds the window layers' blocks (``-1`` before the window).
    :attr:`mm` is the request's multimodal payload (images), ``None`` for text: an object with
    ``positions(start, num)`` (1D rotary positions of tokens ``start..``),
    ``position_offset`` (position minus index after the prompt) and ``hash_tokens(start,
    tokens)`` (ids for the prefix-cache hash, keyed by image content); optionally
    ``for_step(start, num)``, the part a parallel step feeding tokens ``start..`` sends its
    workers (so pixels travel only with the prefill chunks that read them).
    """

    def __init__(self, request_id: str, index: int, prompt_token_ids: list[int],
                 params: SamplingParams, seed: int, group: "SequenceGroup | None" = None) -> None:
        self.seq_id = next(_seq_ids)
        self.request_id = request_id
        self.index = index
        self.prompt_token_ids = list(prompt_token_ids)
        self.output_token_ids: list[int] = []
        self.params = params
        self.seed = seed
        self.group = group
        self.status = SequenceStatus.WAITING
        self.num_computed_tokens = 0
        self.block_table: list[int] = []
        self.window_block_table: list[int] = []
        self.block_hashes: list[bytes] = []
        self.num_committed_blocks = 0
        self.table_epoch = 0
        self.state_slot = -1
        self.num_cached_tokens = 0
        self.logprobs: list[TokenLogprob] | None = [] if params.logprobs is not None else None
        self.finish_reason: str | None = None
        self.stop_reason: str | int | None = None
        self.stop_state: Any = None
        self.mm: Any = None

    @property
    def token_ids(self) -> list[int]:
        """Prompt followed by the generated tokens."""
        return self.prompt_token_ids + self.output_token_ids

    def __len__(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_uncomputed_tokens(self) -> int:
        """Tokens whose KV is not yet in the cache (the last one is the next query)."""
        return len(self) - self.num_computed_tokens

    @property
    def is_prefilling(self) -> bool:
        """More than one token still lacks its KV (a prompt, or a stream after preemption)."""
        return self.num_uncomputed_tokens > 1

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def token_id_at(self, i: int) -> int:
        n = len(self.prompt_token_ids)
        return self.prompt_token_ids[i] if i < n else self.output_token_ids[i - n]

    def tokens_range(self, start: int, stop: int) -> list[int]:
        """``token_ids[start:stop]`` without building the whole stream."""
        n = len(self.prompt_token_ids)
        if stop <= n:
            return self.prompt_token_ids[start:stop]
        if start >= n:
            return self.output_token_ids[start - n:stop - n]
        return self.prompt_token_ids[start:] + self.output_token_ids[:stop - n]

    def __repr__(self) -> str:
        return (f"Sequence({self.request_id}#{self.index}, len={len(self)}, "
                f"computed={self.num_computed_tokens}, {self.status.value})")


@dataclass
class SequenceGroup:
    """One request: its prompt, params and the ``n`` sequences generated from it."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    seqs: list[Sequence]
    metrics: RequestMetrics
    prompt_logprobs: list[TokenLogprob | None] | None = None
    pending: list[Sequence] = field(default_factory=list)

    @property
    def is_finished(self) -> bool:
        return all(s.is_finished for s in self.seqs)

    @property
    def num_cached_tokens(self) -> int:
        return max((s.num_cached_tokens for s in self.seqs), default=0)

    def output(self) -> RequestOutput:
        """The request's state now; each completion's ``new_*`` fields hold what was added
        since the previous call."""
        completions = []
        for seq in self.seqs:
            st = seq.stop_state
            # finished: real lists; running: views of the append-only lists (no per-step copy)
            done = seq.finish_reason is not None
            tokens = list(seq.output_token_ids) if done else Prefix(seq.output_token_ids)
            text = st.text[:st.released]
            logprobs = None
            if seq.logprobs is not None:
                logprobs = list(seq.logprobs) if done else Prefix(seq.logprobs)
            completions.append(CompletionOutput(
                index=seq.index, token_ids=tokens, text=text,
                new_token_ids=list(tokens[st.reported_tokens:]), new_text=text[st.reported_text:],
                logprobs=logprobs, finish_reason=seq.finish_reason, stop_reason=seq.stop_reason))
            st.reported_tokens, st.reported_text = len(tokens), len(text)
        return RequestOutput(self.request_id, self.prompt_token_ids, completions,
                             finished=self.is_finished, num_cached_tokens=self.num_cached_tokens,
                             metrics=self.metrics, prompt_logprobs=self.prompt_logprobs)
