"""A drafter for speculative-decoding tests: known continuations, wrong on purpose.

Random tiny models rarely repeat themselves, so n-gram lookup drafts little on them. Tests
instead draft from each request's known output (a run without speculation) and corrupt a
share of the drafts, which exercises every acceptance count ``0..K`` in mixed batches.
"""

from __future__ import annotations

import random


class ScriptedProposer:
    """Drafts ``continuations[request_id][len(output):][:k]``, each wrong with ``wrong_rate``.

    Args:
        continuations: request id (or prompt token ids as a tuple) -> the tokens it
            generates without speculation.
        vocab_size: a wrong draft is the right one plus one, modulo this.
        wrong_rate: probability that a draft is made wrong.
        seed: seed of the corruption.
    """

    def __init__(self, continuations: dict[str, list[int]], vocab_size: int,
                 wrong_rate: float = 0.3, seed: int = 0) -> None:
        self.continuations = continuations
        self.vocab_size, self.wrong_rate = vocab_size, wrong_rate
        self.rng = random.Random(seed)

    def propose(self, seq, num_tokens: int) -> list[int]:
        """Drafts for ``seq`` (``[]`` for requests without a known continuation)."""
        known = (self.continuations.get(seq.request_id)
                 or self.continuations.get(tuple(seq.prompt_token_ids)) or [])
        m = len(seq.output_token_ids)
        drafts = list(known[m:m + num_tokens])
        for i, token in enumerate(drafts):
            if self.rng.random() < self.wrong_rate:
                drafts[i] = (token + 1) % self.vocab_size
        return drafts

    def observe(self, layout: list) -> None:
        """Nothing to update after a step."""
