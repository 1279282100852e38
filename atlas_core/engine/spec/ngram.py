"""Prompt-lookup (n-gram) drafts: continue the sequence the way it went on after the last
earlier occurrence of its own suffix. Works for any model; pays off where the output re-emits
context (code edits, tool output, quoted documents)."""

from __future__ import annotations

import numpy as np


def ngram_drafts(token_ids: list[int], num_tokens: int, min_n: int, max_n: int) -> list[int]:
    """Up to ``num_tokens`` drafts after the most recent earlier match of the stream's suffix.

    The longest suffix n-gram (``max_n`` down to ``min_n`` tokens) that also occurs earlier in
    ``token_ids`` wins; of its occurrences the most recent one with a continuation is used.

    Args:
        token_ids: prompt followed by the tokens generated so far.
        num_tokens: most drafts to return.
        min_n, max_n: shortest / longest suffix to look up.

    Returns:
        The tokens that followed the match (possibly fewer than ``num_tokens``), or ``[]``.
    """
    length = len(token_ids)
    if num_tokens <= 0 or length < min_n + 1:
        return []
    tokens = np.asarray(token_ids, np.int64)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        suffix = tokens[length - n:]
        hits = np.flatnonzero(tokens[:length - n] == suffix[0])
        for j in range(1, n):
            if not hits.size:
                break
            hits = hits[tokens[hits + j] == suffix[j]]
        if hits.size:
            start = int(hits[-1]) + n
            return tokens[start:start + num_tokens].tolist()
    return []


class NgramProposer:
    """Drafts for one sequence by :func:`ngram_drafts`.

    Args:
        min_n, max_n: the ``prompt_lookup_min`` / ``prompt_lookup_max`` of the config.
    """

    def __init__(self, min_n: int, max_n: int) -> None:
        self.min_n, self.max_n = min_n, max_n

    def propose(self, seq, num_tokens: int) -> list[int]:
        """Drafts continuing ``seq`` (a :class:`~atlas_core.engine.sequence.Sequence`)."""
        return ngram_drafts(seq.token_ids, num_tokens, self.min_n, self.max_n)

    def observe(self, layout: list) -> None:
        """Nothing to learn from a step: drafts come from the tokens alone."""
