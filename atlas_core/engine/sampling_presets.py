"""Sampling defaults of a model: ``generation_config.json`` plus per-mode presets.

Model cards recommend different values by mode (Qwen3.5: one set while thinking, another
without, another for tool calls). Presets come from, later ones winning field by field:

1. the model plugin: ``sampling_presets`` declared on its weight-loader class;
2. the model directory: ``sampling_presets.json``;
3. the user: ``--sampling-presets FILE`` (:attr:`EngineArgs.sampling_presets`).

Each is a JSON object ``{"thinking": {...}, "non_thinking": {...}, "tool_calls": {...}}`` of
:data:`PRESET_FIELDS`. A request's own values override the preset of its mode, which
overrides the ``generation_config.json`` defaults.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

#: Modes a preset may be declared for.
PRESET_MODES = ("thinking", "non_thinking", "tool_calls")
#: Fields ``generation_config.json`` supplies.
GENERATION_FIELDS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
#: Fields a preset may set.
PRESET_FIELDS = GENERATION_FIELDS + (
    "presence_penalty", "frequency_penalty", "dry_multiplier", "dry_base", "dry_allowed_length",
    "dry_sequence_breakers", "xtc_threshold", "xtc_probability", "top_n_sigma")
#: The model-directory file of presets.
PRESETS_FILE = "sampling_presets.json"


def check_presets(presets: Any, source: str) -> dict[str, dict[str, Any]]:
    """Validate a presets object; returns it as ``{mode: {field: value}}``.

    Raises:
        ValueError: naming the source, the mode or field that is wrong and what is allowed.
    """
    from atlas_core.engine.sampling_params import SamplingParams
    if not isinstance(presets, dict):
        raise ValueError(f"sampling presets in {source} must be a JSON object of modes "
                         f"({', '.join(PRESET_MODES)})")
    out = {}
    for mode, fields in presets.items():
        if mode not in PRESET_MODES:
            raise ValueError(f"sampling presets in {source}: unknown mode {mode!r}; use "
                             f"{', '.join(PRESET_MODES)}")
        if not isinstance(fields, dict) or set(fields) - set(PRESET_FIELDS):
            bad = sorted(set(fields) - set(PRESET_FIELDS)) if isinstance(fields, dict) else fields
            raise ValueError(f"sampling presets in {source}, mode {mode}: unknown fields {bad}; "
                             f"allowed: {', '.join(PRESET_FIELDS)}")
        try:
            SamplingParams(**fields)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"sampling presets in {source}, mode {mode}: {exc}") from None
        out[mode] = dict(fields)
    return out


def read_presets_file(path: str | Path) -> dict[str, dict[str, Any]]:
    """Presets from a JSON file (see :func:`check_presets`)."""
    try:
        raw = json.loads(Path(path).expanduser().read_text())
    except OSError as exc:
        raise ValueError(f"cannot read sampling presets file {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise ValueError(f"sampling presets file {path} is not valid JSON: {exc}") from None
    return check_presets(raw, str(path))


def _plugin_presets(model: Any) -> Any:
    presets = getattr(model, "sampling_presets", None)
    if presets is not None:
        return presets
    archs = (getattr(model, "config", None) or {}).get("architectures") or ()
    if not archs:
        return None
    from atlas_core.plugins import Registry
    try:
        loader = Registry().get("weight_loaders", archs[0])
    except (KeyError, ImportError):
        return None
    return getattr(loader, "sampling_presets", None)


def merge_presets(*layers: dict[str, dict[str, Any]] | None) -> dict[str, dict[str, Any]]:
    """Merge preset layers mode by mode, later layers winning field by field."""
    merged: dict[str, dict[str, Any]] = {}
    for layer in layers:
        for mode, fields in (layer or {}).items():
            merged.setdefault(mode, {}).update(fields)
    return merged


def model_presets(model: Any, user_file: str | None = None) -> dict[str, dict[str, Any]]:
    """The presets of ``model``: plugin, then model directory, then ``user_file``."""
    plugin = _plugin_presets(model)
    layers = [check_presets(plugin, "the model plugin") if plugin else None]
    path = getattr(model, "path", None)
    if path is not None and (Path(path) / PRESETS_FILE).is_file():
        layers.append(read_presets_file(Path(path) / PRESETS_FILE))
    if user_file:
        layers.append(read_presets_file(user_file))
    return merge_presets(*layers)


def defaults_for(generation_defaults: dict[str, Any], presets: dict[str, dict[str, Any]],
                 mode: str | None) -> dict[str, Any]:
    """Sampling defaults of a request in ``mode`` (``None``: no preset)."""
    base = {k: v for k, v in generation_defaults.items() if k in GENERATION_FIELDS}
    return {**base, **(presets.get(mode, {}) if mode else {})}
