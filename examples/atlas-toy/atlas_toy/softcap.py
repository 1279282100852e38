"""The Toy family's own op, ``toy_softcap``: its NumPy reference and its numpy implementation.

The reference is the op's meaning: every backend's implementation is tested against it by the
contract cases of :mod:`atlas_toy.softcap_cases`. The numpy implementation is what the numpy
(and mock) backend runs; it computes the same thing in one float32 buffer.
"""

from __future__ import annotations

import numpy as np


def check_cap(cap: float) -> None:
    """Raise ``ValueError`` unless ``cap`` is positive (shared by every implementation)."""
    if not cap > 0:
        raise ValueError(f"toy_softcap: cap must be positive, got {cap!r}")


def toy_softcap(x: np.ndarray, cap: float) -> np.ndarray:
    """Soft-cap ``x`` into ``(-cap, cap)``: ``out = cap * tanh(x / cap)``.

    Near zero the op is the identity; large values saturate smoothly at ``±cap`` (Gemma 2
    caps its attention scores and final logits this way).

    Args:
        x: any shape; float32, float16 or bfloat16.
        cap: the bound, a positive float.

    Returns:
        A new array of ``x``'s shape and dtype; the math runs in float64 here, float32 in the
        implementations.

    Raises:
        ValueError: ``cap`` is not positive.
    """
    check_cap(cap)
    return (cap * np.tanh(x.astype(np.float64) / cap)).astype(x.dtype)


def toy_softcap_numpy(x: np.ndarray, cap: float) -> np.ndarray:
    """The numpy backend's ``toy_softcap``: same signature and result as :func:`toy_softcap`,
    computed in float32 in one buffer (multiply by ``1 / cap``, tanh, scale in place)."""
    check_cap(cap)
    out = np.multiply(x, np.float32(1.0 / cap), dtype=np.float32)
    np.tanh(out, out=out)
    out *= np.float32(cap)
    return out.astype(x.dtype, copy=False)
