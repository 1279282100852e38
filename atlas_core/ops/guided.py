"""Reference guided-decoding op: mask logits with a per-row token bitmask (structured outputs)."""

from __future__ import annotations

import numpy as np

from atlas_core.ops._dtypes import f32


def bitmask_width(vocab_size: int) -> int:
    """int32 words per bitmask row: ``ceil(vocab_size / 32)``."""
    return (vocab_size + 31) // 32


def apply_token_bitmask(logits: np.ndarray, bitmask: np.ndarray) -> np.ndarray:
    """Set the logits of tokens a grammar forbids to ``-inf``.

    Bit ``v % 32`` of word ``v // 32`` of row ``b`` (little-endian bit order, the layout
    llguidance fills) set means token ``v`` is allowed in row ``b``::

        allowed[b, v] = (bitmask[b, v // 32] >> (v % 32)) & 1
        out[b, v] = logits[b, v] if allowed[b, v] else -inf

    A row of all ones (``-1``) leaves its logits unchanged; bits past ``vocab`` are ignored.

    Args:
        logits: ``[num_seqs, vocab]`` float32.
        bitmask: ``[num_seqs, ceil(vocab / 32)]`` int32.

    Returns:
        ``[num_seqs, vocab]`` float32 (a new array).
    """
    x = f32(logits)
    vocab = x.shape[1]
    words = np.ascontiguousarray(bitmask, dtype=np.int32)
    bits = np.unpackbits(words.view(np.uint8), axis=1, bitorder="little")[:, :vocab]
    return np.where(bits.astype(bool), x, np.float32(-np.inf)).astype(np.float32)
