"""Building engine ``SamplingParams`` from API request fields."""

from __future__ import annotations

import re
from typing import Any

from atlas_core.server.errors import APIError

_FIELD = re.compile(r"^(\w+) must be")
SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "presence_penalty",
                   "frequency_penalty", "repetition_penalty", "min_tokens", "ignore_eos",
                   "skip_special_tokens", "include_stop_str_in_output", "dry_multiplier",
                   "dry_base", "dry_allowed_length", "dry_sequence_breakers", "xtc_threshold",
                   "xtc_probability", "top_n_sigma", "priority", "speculative")


def stop_list(stop: str | list[str] | None) -> list[str] | None:
    if stop is None:
        return None
    stops = [stop] if isinstance(stop, str) else list(stop)
    for i, s in enumerate(stops):
        if not s:
            raise APIError(400, "stop strings must be non-empty", param=f"stop[{i}]")
    return stops


def logit_bias(raw: dict[str, float] | None) -> dict[int, float] | None:
    """OpenAI ``logit_bias`` (token id strings to bias) keyed by int token ids."""
    if not raw:
        return None
    try:
        return {int(k): float(v) for k, v in raw.items()}
    except ValueError:
        raise APIError(400, "logit_bias keys must be token ids (integers as strings)",
                       param="logit_bias") from None


def sampling_kwargs(req: Any, **extra: Any) -> dict[str, Any]:
    """Sampling and agent-guard fields a request set (unset fields keep the model's defaults)."""
    from atlas_core.server.agent_guards import GUARD_FIELDS
    kwargs = {name: getattr(req, name) for name in SAMPLING_FIELDS + GUARD_FIELDS
              if getattr(req, name, None) is not None}
    return {**kwargs, **{k: v for k, v in extra.items() if v is not None}}


def invalid_param(exc: Exception, prefix: str = "") -> APIError:
    """The 400 for a ``ValueError`` of ``SamplingParams`` or the engine's request check, with
    ``param`` set to the field its message names (``"top_k must be ..."``)."""
    match = _FIELD.match(str(exc))
    return APIError(400, f"{prefix}{exc}", param=match.group(1) if match else None)


def make_params(kwargs: dict[str, Any], defaults: dict[str, Any] | None = None, n: int = 1,
                mode: str | None = None):
    """An engine ``SamplingParams``; its ``ValueError`` becomes a 400 naming the field.

    Args:
        kwargs: fields the request set.
        defaults: the model's generation defaults (with their per-mode ``presets``), for
            fields the request left unset.
        n: completions of the prompt (the engine gives each its own random stream).
        mode: the request's preset mode (``thinking``, ``non_thinking``, ``tool_calls``).
    """
    from atlas_core.engine import SamplingParams
    from atlas_core.engine.sampling_presets import defaults_for
    from atlas_core.server.agent_guards import GUARD_FIELDS

    defaults = defaults_for(defaults or {}, (defaults or {}).get("presets") or {}, mode)
    kwargs = {k: v for k, v in kwargs.items() if k not in GUARD_FIELDS}
    merged = {**defaults, **kwargs, "n": n}
    try:
        return SamplingParams(**merged)
    except (ValueError, TypeError) as exc:
        raise invalid_param(exc, "invalid sampling parameter: ") from None


def sampling_mode(state: Any, req: Any, offered: Any, reasoner: Any, opens: bool,
                  guided: Any) -> str:
    """The preset mode of a chat request: ``tool_calls`` when tools are offered, ``thinking``
    when its output starts in (or may open) a think block, else ``non_thinking``."""
    from atlas_core.server.thinking import resolve_thinking
    if offered:
        return "tool_calls"
    if opens:
        return "thinking"
    if reasoner is None or guided is not None:
        return "non_thinking"
    kwargs, _ = resolve_thinking(state.config, req.thinking, req.template_kwargs)
    return "non_thinking" if kwargs.get("enable_thinking") is False else "thinking"
