"""SpeculativeConfig: which drafter, how many tokens it drafts, and when speculation stands down.

Accepts vLLM's ``--speculative-config`` JSON (``{"method": "ngram", "num_speculative_tokens": 3,
"prompt_lookup_max": 4}``) and the original engine's ``--speculative [--num-drafts K]``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any

#: Drafting methods: ``ngram`` (prompt lookup, any model) and ``mtp`` (the checkpoint's own
#: multi-token-prediction head).
METHODS = ("ngram", "mtp")
#: Most draft tokens per step.
MAX_SPECULATIVE_TOKENS = 8
#: vLLM spellings accepted for the same fields.
_ALIASES = {"num_drafts": "num_speculative_tokens", "ngram_prompt_lookup_max": "prompt_lookup_max",
            "ngram_prompt_lookup_min": "prompt_lookup_min"}
#: vLLM fields that change nothing here (the draft model is the checkpoint itself).
_IGNORED = ("model", "draft_tensor_parallel_size", "quantization")


@dataclass(frozen=True)
class SpeculativeConfig:
    """Speculative decoding settings.

    Attributes:
        method: ``ngram`` or ``mtp``.
        num_speculative_tokens: most tokens drafted per sequence and step (``K``); a step
            verifies ``K + 1`` positions.
        prompt_lookup_max, prompt_lookup_min: ``ngram``: the longest / shortest suffix n-gram
            looked up in the sequence's own tokens.
        disable_by_batch_size: no drafts in steps with more decoding sequences than this
            (verification costs grow with the batch while the gain per sequence does not);
            hybrid models keep ``disable_by_batch_size * K`` recurrent-state rows for it.
        draft_token_cost: cost of one verified draft position relative to a plain decode step
            of one sequence; with the measured acceptance it decides how many drafts pay off
            (see :mod:`atlas_core.engine.spec.gate`).
        max_context_len: no drafts for sequences longer than this (``None``: no cap; the
            measured acceptance per context range turns speculation down by itself).
        verify_graphs: replay verify steps from CUDA graphs (engine/verify_graphs.py). Off by
            default: on the H200 (session 16, qwen3.5-35b-a3b shape, K=2) the graph path gave
            other tokens than plain decoding from the first verify step on, and a verify step
            cost 2.9-3.8x a plain one; correct on the CPU backends. The eager verify path is
            the default until the graph path passes on a GPU.
        draft_graphs: ``mtp``: replay the MTP head's draft rounds (forward, logits, argmax over
            one new position per sequence: every chained draft, and the first after a plain
            decode step) from graphs, one per batch bucket (engine/spec/draft_graphs.py);
            other rounds stay eager. Off by default, like ``verify_graphs``, until timed and
            checked on a GPU; no effect with tensor parallelism (the workers draft eagerly).
    """

    method: str = "ngram"
    num_speculative_tokens: int = 2
    prompt_lookup_max: int = 4
    prompt_lookup_min: int = 1
    disable_by_batch_size: int = 16
    draft_token_cost: float = 0.05
    max_context_len: int | None = None
    verify_graphs: bool = False
    draft_graphs: bool = False

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"speculative method must be one of {', '.join(METHODS)}, got "
                             f"{self.method!r}")
        _check_int("num_speculative_tokens", self.num_speculative_tokens, 1, MAX_SPECULATIVE_TOKENS)
        _check_int("prompt_lookup_min", self.prompt_lookup_min, 1, 64)
        _check_int("prompt_lookup_max", self.prompt_lookup_max, self.prompt_lookup_min, 64)
        _check_int("disable_by_batch_size", self.disable_by_batch_size, 1, 1 << 16)
        if not 0.0 <= float(self.draft_token_cost) < 1.0:
            raise ValueError(f"draft_token_cost must be in [0, 1), got {self.draft_token_cost!r}")
        if self.max_context_len is not None:
            _check_int("max_context_len", self.max_context_len, 1, 1 << 31)

    @classmethod
    def parse(cls, value: Any) -> "SpeculativeConfig | None":
        """A config from ``None``, a config, a dict or its JSON text.

        Raises:
            ValueError: unknown fields, bad JSON or values out of range (the message names the
                field and what it accepts).
        """
        if value is None or isinstance(value, cls):
            return value
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError as exc:
                raise ValueError(f"speculative config is not valid JSON ({exc}); use e.g. "
                                 '\'{"method": "ngram", "num_speculative_tokens": 2}\'') from None
        if not isinstance(value, dict):
            raise ValueError("speculative config must be a JSON object, e.g. "
                             '{"method": "mtp", "num_speculative_tokens": 2}')
        known = {f.name for f in fields(cls)}
        kwargs = {}
        for key, item in value.items():
            key = _ALIASES.get(key, key)
            if key in _IGNORED:
                continue
            if key not in known:
                raise ValueError(f"unknown speculative config field {key!r}; known: "
                                 f"{', '.join(sorted(known))}")
            kwargs[key] = item
        return cls(**kwargs)

    @property
    def state_rows(self) -> int:
        """Recurrent-state rows a hybrid model keeps for per-position state candidates, plus
        one scratch row that padding entries of graph-captured verify steps copy onto itself
        (:mod:`atlas_core.engine.verify_graphs`)."""
        return self.disable_by_batch_size * self.num_speculative_tokens + 1


def _check_int(name: str, value: Any, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{name} must be an integer in [{low}, {high}], got {value!r}")
