"""`TokenBitmask`: the step's grammar masks, filled on the host and applied on the device."""

from __future__ import annotations

import numpy as np

from atlas_core.guided.matcher import GuidedMatcher, fill_bitmasks
from atlas_core.ops.guided import bitmask_width


class TokenBitmask:
    """Masks logits rows whose sequence decodes under a grammar.

    Host and device buffers are allocated on the first guided step and grow (to the next power
    of two of rows) only when a step has more rows than ever before, so a step costs one
    host->device copy and one ``ops.apply_token_bitmask``.

    Args:
        backend: the GpuBackend.
        vocab_size: logits width.
    """

    def __init__(self, backend, vocab_size: int) -> None:
        self.backend = backend
        self.width = bitmask_width(vocab_size)
        self.host: np.ndarray | None = None
        self.device = None

    def _reserve(self, num_rows: int) -> None:
        if self.host is None or self.host.shape[0] < num_rows:
            rows = 1 << max(0, num_rows - 1).bit_length()
            self.host = np.full((rows, self.width), -1, np.int32)
            self.device = self.backend.from_host(self.host)

    def apply(self, logits, matchers: list[GuidedMatcher | None],
              drafts: list[tuple[int, ...]] | None = None):
        """``logits`` (device float32 ``[len(matchers), vocab]``) with each row that has a
        matcher masked to the tokens its grammar allows next; rows with None are unchanged.

        ``drafts[i]`` (speculative decoding): tokens row ``i`` follows that its matcher has not
        consumed yet; its mask is the grammar's after them (all ones once a draft is one the
        grammar forbids: the row can never be kept).
        """
        n = len(matchers)
        self._reserve(n)
        if drafts is None or not any(drafts):
            fill_bitmasks(matchers, self.host)
        else:
            fill_bitmasks([m if not d else None for m, d in zip(matchers, drafts)], self.host)
            for i, (m, d) in enumerate(zip(matchers, drafts)):
                if m is not None and d:
                    fill_after(m, d, self.host[i])
        self.backend.copy_from_host(self.device[:n], self.host[:n])
        return self.backend.ops.apply_token_bitmask(logits, self.device[:n])


def fill_after(matcher: GuidedMatcher, tokens: tuple[int, ...], row: np.ndarray) -> None:
    """``row``: the mask of ``matcher`` once it consumed ``tokens`` (then rolled back)."""
    words = row.view(np.uint32)
    consumed = 0
    for token in tokens:
        matcher.fill_bitmask(row)
        if not words[token // 32] >> np.uint32(token % 32) & np.uint32(1) or matcher.is_finished():
            row[:] = -1
            break
        matcher.consume(token)
        consumed += 1
    else:
        matcher.fill_bitmask(row)
    if consumed:
        matcher.rollback(consumed)
