"""The engine's checks of one request before it is queued."""

from __future__ import annotations

from typing import Any

from atlas_core.engine.sampling_params import SamplingParams


def check_request(prompt: list[int], params: SamplingParams, *, vocab_size: int, guided: Any,
                  has_detokenizer: bool, max_seq_len: int) -> None:
    """Raise ``ValueError`` (one line, how to fix it) when the request cannot be served.

    Args:
        prompt: token ids.
        params: the request's sampling settings.
        vocab_size: the model's vocabulary size.
        guided: the engine's :class:`~atlas_core.guided.sequences.GuidedSequences`.
        has_detokenizer: the engine produces text (stop strings need it).
        max_seq_len: the engine's longest prompt + output.
    """
    if not prompt:
        raise ValueError("the prompt is empty; give at least one token")
    bad = [t for t in prompt if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"prompt token ids must be in [0, {vocab_size}), got {bad[:3]}")
    params.validate_vocab(vocab_size)
    guided.check(params)
    if params.stop and not has_detokenizer:
        raise ValueError("stop strings need a tokenizer; this engine has none (use stop_token_ids)")
    want = len(prompt) + (params.max_tokens or 1)
    if want > max_seq_len:
        raise ValueError(
            f"this engine's maximum context length is {max_seq_len} tokens, but the request "
            f"needs {want} ({len(prompt)} in the prompt, {params.max_tokens or 1} to generate); "
            "shorten the prompt or lower max_tokens")
