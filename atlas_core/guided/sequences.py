"""`GuidedSequences`: the engine's per-sequence grammar matchers.

The engine asks it to check a request's constraint up front (a bad schema is a 400, not a
failed step), to start one matcher per sequence (so ``n > 1`` siblings advance independently),
for the matcher of each sampling row, and to feed it every accepted token. A matcher follows
the sequence's output token ids, which survive preemption; if they ever differ from what it
consumed, it replays them (:meth:`GuidedMatcher.sync`).
"""

from __future__ import annotations

import logging

from atlas_core.guided.compiler import GrammarCompiler
from atlas_core.guided.matcher import GuidedMatcher
from atlas_core.guided.params import GuidedDecodingError

log = logging.getLogger(__name__)


class GuidedSequences:
    """Matchers of the engine's guided sequences, by ``seq_id``.

    Args:
        tokenizer: the model's tokenizer (None: guided requests are refused).
        vocab_size: the model's logits width.
    """

    def __init__(self, tokenizer, vocab_size: int) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self._compiler: GrammarCompiler | None = None
        self._matchers: dict[int, GuidedMatcher] = {}

    @property
    def compiler(self) -> GrammarCompiler:
        if self._compiler is None:
            if self.tokenizer is None:
                raise GuidedDecodingError("guided decoding needs a tokenizer; this engine has none")
            self._compiler = GrammarCompiler(self.tokenizer, self.vocab_size)
        return self._compiler

    def check(self, params) -> None:
        """Raise :class:`GuidedDecodingError` when ``params.guided`` cannot be compiled."""
        if getattr(params, "guided", None) is not None:
            self.compiler.check(params.guided)

    def start(self, seq) -> None:
        """Give ``seq`` a fresh matcher when its params are guided."""
        if getattr(seq.params, "guided", None) is not None:
            self._matchers[seq.seq_id] = self.compiler.matcher(seq.params.guided)

    def matcher(self, seq) -> GuidedMatcher | None:
        """The matcher of ``seq`` in step with its output so far (None when unguided)."""
        m = self._matchers.get(seq.seq_id)
        if m is not None:
            m.sync(seq.output_token_ids)
        return m

    def accept(self, seq, token_id: int) -> bool:
        """Feed ``seq``'s newly accepted token; True when its grammar is now complete."""
        m = self._matchers.get(seq.seq_id)
        if m is None:
            return False
        if not m.consume(token_id):
            log.warning("guided decoding of %s stopped: %s", seq, m.error)
            return True
        return m.is_finished()

    def forget(self, seq) -> None:
        """Drop the matcher of a finished or aborted sequence."""
        self._matchers.pop(seq.seq_id, None)
