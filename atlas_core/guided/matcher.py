"""`GuidedMatcher`: one sequence's position in its grammar, and batched bitmask filling."""

from __future__ import annotations

import threading

import numpy as np

_executor = None
_executor_lock = threading.Lock()


def _get_executor():
    global _executor
    with _executor_lock:
        if _executor is None:
            import llguidance
            _executor = llguidance.LLExecutor()
        return _executor


class GuidedMatcher:
    """The grammar state of one generated sequence (wraps an ``llguidance.LLMatcher``).

    Created by :meth:`atlas_core.guided.GrammarCompiler.matcher`. Not thread-safe: one engine
    thread fills, consumes and rolls back.

    Args:
        matcher: a fresh ``llguidance.LLMatcher``.
        vocab_size: logits width the bitmask covers.
        eos_aliases: EOS ids the grammar does not know (older llguidance takes one EOS id):
            allowed wherever ``eos_token`` is, and consumed as it.
        eos_token: the EOS id the grammar ends with.
    """

    def __init__(self, matcher, vocab_size: int, eos_aliases: tuple[int, ...] = (),
                 eos_token: int | None = None) -> None:
        self._matcher = matcher
        self.vocab_size = vocab_size
        self.num_tokens = 0
        self.eos_aliases = eos_aliases if eos_token is not None else ()
        self.eos_token = eos_token

    @property
    def bitmask_width(self) -> int:
        """int32 words per bitmask row: ``ceil(vocab_size / 32)``."""
        return (self.vocab_size + 31) // 32

    def fill_bitmask(self, row: np.ndarray) -> None:
        """Write the allowed next tokens into ``row`` (int32 ``[ceil(vocab/32)]``, contiguous).

        Bit ``v % 32`` of word ``v // 32`` set means token ``v`` may come next (the layout of
        :func:`atlas_core.ops.reference.apply_token_bitmask`).
        """
        if row.dtype != np.int32 or row.shape != (self.bitmask_width,) or not row.flags.c_contiguous:
            raise ValueError(f"bitmask row must be contiguous int32 [{self.bitmask_width}], "
                             f"got {row.dtype} {row.shape}")
        self._matcher.unsafe_compute_mask_ptr(row.ctypes.data, row.nbytes)
        self._allow_eos_aliases(row)

    def _allow_eos_aliases(self, row: np.ndarray) -> None:
        if not self.eos_aliases:
            return
        words = row.view(np.uint32)
        if words[self.eos_token // 32] >> np.uint32(self.eos_token % 32) & np.uint32(1):
            for token_id in self.eos_aliases:
                words[token_id // 32] |= np.uint32(1 << (token_id % 32))

    def _grammar_id(self, token_id: int) -> int:
        return self.eos_token if token_id in self.eos_aliases else int(token_id)

    def consume(self, token_id: int) -> bool:
        """Advance past ``token_id``; False when the grammar does not allow it (then :attr:`error`)."""
        ok = self._matcher.consume_token(self._grammar_id(token_id))
        self.num_tokens += 1
        return ok

    def is_finished(self) -> bool:
        """No more tokens can follow (the grammar is complete, or the matcher failed)."""
        return self._matcher.is_stopped()

    def is_accepting(self) -> bool:
        """The text so far is a complete sentence of the grammar (it may still go on)."""
        return self._matcher.is_accepting()

    @property
    def error(self) -> str | None:
        """Why the matcher failed (a token the grammar forbids was consumed), else None."""
        return self._matcher.get_error() or None

    def rollback(self, num_tokens: int) -> bool:
        """Undo the last ``num_tokens`` consumed tokens (speculative decoding)."""
        ok = self._matcher.rollback(num_tokens)
        if ok:
            self.num_tokens -= num_tokens
        return ok

    def reset(self) -> None:
        """Back to the start of the grammar."""
        self._matcher.reset()
        self.num_tokens = 0

    def sync(self, token_ids: list[int]) -> None:
        """Make the state match ``token_ids`` (the sequence's output so far) when it does not.

        Output tokens survive preemption, so this only replays after something rewrote them.
        """
        if self.num_tokens != len(token_ids):
            self.reset()
            self._matcher.consume_tokens([self._grammar_id(t) for t in token_ids])
            self.num_tokens = len(token_ids)


def fill_bitmasks(matchers: list[GuidedMatcher | None], bitmask: np.ndarray) -> None:
    """Fill ``bitmask[i]`` from ``matchers[i]`` (in parallel); rows without a matcher get all ones.

    Args:
        matchers: one entry per logits row.
        bitmask: int32 ``[>= len(matchers), ceil(vocab / 32)]``, C-contiguous.
    """
    bitmask[:len(matchers)] = -1
    jobs = [(m._matcher, i) for i, m in enumerate(matchers) if m is not None]
    if not jobs:
        return
    width = bitmask.shape[1]
    if len(jobs) == 1:
        matchers[jobs[0][1]].fill_bitmask(bitmask[jobs[0][1]])
        return
    _get_executor().unsafe_compute_mask_ptr(jobs, bitmask.ctypes.data, width * 4, bitmask.shape[0])
    for _, i in jobs:
        matchers[i]._allow_eos_aliases(bitmask[i])
