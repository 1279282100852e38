"""DRY, XTC and top-n-sigma in the sampler: per-row vectors, then the backend's ops.

Rows that do not ask for a filter get parameters that switch it off, so the ops only change
the rows that do. The numpy and CUDA backends implement the ops (CUDA: atlas-cuda's
``logits_filters.cu`` kernels, on the device's logits); a backend without an implementation of
one of them gets the NumPy reference on a host copy of the logits, so the filters are never
skipped. That host round trip copies ``rows x vocab`` float32 both ways and only runs in steps
where some row asks for a filter.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from atlas_core.ops import logits_filters as reference

#: The filter ops in the order they run (before temperature, top-k/p and min-p).
FILTER_OPS = ("apply_dry", "apply_xtc", "apply_top_n_sigma")


def breaker_ids(params: Any, encode: Callable[[str], list[int]] | None) -> list[int]:
    """Token ids that end a DRY match: the last token of each breaker string, plus the given ids.

    Resolved once per request (cached on ``params``); without a tokenizer only the ids count.
    """
    cached = getattr(params, "_dry_breaker_ids", None)
    if cached is not None:
        return cached
    ids = list(params.dry_sequence_breaker_ids)
    if encode is not None:
        for text in params.dry_sequence_breakers:
            tokens = encode(text)
            if tokens:
                ids.append(int(tokens[-1]))
    params._dry_breaker_ids = sorted(set(ids))
    return params._dry_breaker_ids


def _padded(lists: list[list[int]]) -> np.ndarray:
    width = max(1, max((len(x) for x in lists), default=1))
    out = np.full((max(1, len(lists)), width), -1, np.int32)
    for i, x in enumerate(lists):
        out[i, :len(x)] = x
    return out


def _run(backend: Any, name: str, logits: Any, *host_args: np.ndarray) -> Any:
    if name in backend.ops:
        return getattr(backend.ops, name)(logits, *(backend.from_host(a) for a in host_args))
    host = np.asarray(backend.to_host(logits), np.float32)
    return backend.from_host(getattr(reference, name)(host, *host_args))


def apply_logits_filters(backend: Any, logits: Any, rows: list, steps: np.ndarray,
                         encode: Callable[[str], list[int]] | None = None) -> Any:
    """Apply the filters some row of ``rows`` (:class:`~atlas_core.engine.sampler.LogitsRow`)
    asks for; returns the (possibly new) device logits.

    Args:
        backend: the GpuBackend.
        logits: device ``[len(rows), vocab]`` float32.
        rows: the step's logits rows.
        steps: ``[len(rows)]`` output index of each row (the sampler's counter).
        encode: text -> token ids, for DRY breaker strings (``None``: ids only).
    """
    params = [r.seq.params if r.samples else None for r in rows]
    live = [p for p in params if p is not None]
    if any(p.dry_multiplier > 0 for p in live):
        on = [p is not None and p.dry_multiplier > 0 for p in params]
        ctx = _padded([r.seq.token_ids + list(r.draft_ids) if o else []
                       for r, o in zip(rows, on)])
        stops = _padded([breaker_ids(p, encode) if o else [] for p, o in zip(params, on)])
        vec = [np.array([getattr(p, f) if o else d for p, o in zip(params, on)], t)
               for f, d, t in (("dry_multiplier", 0.0, np.float32), ("dry_base", 2.0, np.float32),
                               ("dry_allowed_length", 1, np.int32))]
        logits = _run(backend, "apply_dry", logits, ctx, *vec, stops)
    if any(p.xtc_probability > 0 for p in live):
        thr = np.array([p.xtc_threshold if p else 1.0 for p in params], np.float32)
        prob = np.array([p.xtc_probability if p else 0.0 for p in params], np.float32)
        seeds = np.array([r.seq.seed for r in rows], np.uint64)
        logits = _run(backend, "apply_xtc", logits, thr, prob, seeds,
                      np.asarray(steps, np.int64)[:len(rows)])
    if any(p.top_n_sigma > 0 for p in live):
        sig = np.array([p.top_n_sigma if p else 0.0 for p in params], np.float32)
        logits = _run(backend, "apply_top_n_sigma", logits, sig)
    return logits
