"""Thinking budgets: end a think block cleanly once it used its share of tokens.

A request with ``SamplingParams.thinking_budget`` counts the tokens it generates inside its
think block. The block is open from the first output token when the prompt opened it (no
``thinking_start_token_ids``), else once the first generated token is one of those ids. When
the count reaches the budget before the model closed the block itself, the next tokens are
replaced by ``thinking_end_token_ids`` (e.g. ``</think>`` and the newlines the chat template
puts after it) and sampling then goes on normally: the answer follows.

Forcing happens on the host after sampling, so decode graphs and the device sampler are
untouched; a forced token's logprob is reported as 0 (it was certain).
"""

from __future__ import annotations

from dataclasses import dataclass

from atlas_core.engine.outputs import TokenLogprob


@dataclass
class _ThinkState:
    is_open: bool
    num_tokens: int = 0
    num_forced: int = 0
    is_done: bool = False


class ThinkingBudgets:
    """Per-sequence think-block tracking for the engine (one instance per engine)."""

    def __init__(self) -> None:
        self._states: dict[int, _ThinkState] = {}

    def next_token(self, seq, sampled: int, logprob: TokenLogprob | None
                   ) -> tuple[int, TokenLogprob | None]:
        """The token ``seq`` really takes after sampling ``sampled`` (and its logprob)."""
        p = seq.params
        if p.thinking_budget is None:
            return sampled, logprob
        state = self._states.get(seq.seq_id)
        if state is None:
            state = self._states[seq.seq_id] = _ThinkState(is_open=not p.thinking_start_token_ids)
            if not state.is_open:
                state.is_open = sampled in p.thinking_start_token_ids
                state.is_done = not state.is_open
                return sampled, logprob
        if state.is_done:
            return sampled, logprob
        end = p.thinking_end_token_ids
        if state.num_forced or state.num_tokens >= p.thinking_budget:
            token = end[state.num_forced]
            state.num_forced += 1
            state.is_done = state.num_forced == len(end)
            forced = None if logprob is None else TokenLogprob(token, 0.0, logprob.top)
            return token, forced
        state.num_tokens += 1
        state.is_done = sampled == end[0]
        return sampled, logprob

    def num_unforced(self, seq) -> int | None:
        """Tokens ``seq`` will still take as sampled before the budget forces the block's end
        (``None``: no budget applies any more); speculative decoding drafts no further."""
        p = seq.params
        if p.thinking_budget is None:
            return None
        state = self._states.get(seq.seq_id)
        if state is None or state.num_forced:
            return 0
        return None if state.is_done else p.thinking_budget - state.num_tokens

    def forget(self, seq) -> None:
        """Drop the state of a finished or aborted sequence."""
        self._states.pop(seq.seq_id, None)
