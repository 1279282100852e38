"""``load_model``: name or path -> config.json -> the registered loader -> a CausalLM on a backend."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from atlas_core.model.config_fields import canonical_config
from atlas_core.model.model import CausalLM
from atlas_core.plugins import Registry
from atlas_core.weights.checkpoint import Checkpoint
from atlas_core.weights.quantization import check_supported
from atlas_core.weights.resolve import resolve_model

#: Plugin distribution published from this repository -> the architectures it registers, for the
#: install hint when it is missing (a test keeps this in step with the plugins' registrations).
KNOWN_FAMILIES = {
    "atlas-qwen3": ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "LlamaForCausalLM",
                    "MistralForCausalLM"),
    "atlas-qwen35": ("Qwen3NextForCausalLM", "Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM",
                     "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration"),
    "atlas-gemma4": ("Gemma4ForCausalLM", "Gemma4ForConditionalGeneration", "Gemma3ForCausalLM",
                     "Gemma3ForConditionalGeneration"),
    "atlas-minimax": ("MiniMaxM2ForCausalLM",),
    "atlas-qwen3vl": ("Qwen3VLForConditionalGeneration", "Qwen3VLMoeForConditionalGeneration"),
    "atlas-deepseek": ("DeepseekV3ForCausalLM",),
    "atlas-mistral": ("Mistral4ForCausalLM", "Mistral3ForConditionalGeneration"),
    "atlas-nemotron-h": ("NemotronHForCausalLM",),
}

# Fields a multimodal wrapper keeps at the top level that the text model needs.
_INHERITED = ("architectures", "torch_dtype", "dtype", "tie_word_embeddings", "quantization_config",
              "vision_config", "image_token_id", "video_token_id", "vision_start_token_id",
              "vision_end_token_id")


class ModelConfigError(ValueError):
    """config.json is missing, unreadable, or names an architecture no plugin supports."""


def read_config(path: str | os.PathLike) -> dict[str, Any]:
    """The text-model config of a model directory.

    For multimodal wrappers (a ``text_config`` entry) the text config is returned, with the
    wrapper's ``architectures``, dtype, ``tie_word_embeddings`` and ``quantization_config`` kept
    when the text config lacks them. Fields saved under another transformers release's name
    are also found under the name loaders read (:mod:`~atlas_core.model.config_fields`).

    Raises:
        ModelConfigError: no ``config.json``, invalid JSON, or not an object.
    """
    file = Path(path) / "config.json"
    if not file.is_file():
        raise ModelConfigError(f"no config.json in {path}: not a Hugging Face model directory "
                               "(pass the directory holding config.json and *.safetensors)")
    try:
        config = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelConfigError(f"{file}: invalid JSON ({exc})") from None
    if not isinstance(config, dict):
        raise ModelConfigError(f"{file}: expected a JSON object")
    text = config.get("text_config")
    if isinstance(text, dict):
        text = dict(text)
        for key in _INHERITED:
            if key in config:
                text.setdefault(key, config[key])
        return canonical_config(text)
    return canonical_config(config)


def architecture(config: dict[str, Any]) -> str:
    """``config["architectures"][0]``; :class:`ModelConfigError` when absent."""
    archs = config.get("architectures")
    if not archs or not isinstance(archs, list):
        raise ModelConfigError("config.json has no 'architectures' list; add e.g. "
                               "\"architectures\": [\"Qwen3ForCausalLM\"]")
    return archs[0]


def plugin_for(arch: str) -> str | None:
    """The plugin distribution known to support ``arch``, if any."""
    for dist, architectures in KNOWN_FAMILIES.items():
        if arch in architectures:
            return dist
    return None


def create_loader(registry: Registry, arch: str) -> Any:
    """Instantiate the weight loader registered for ``arch``, with a helpful error if none is."""
    if arch not in registry.names("weight_loaders"):
        known = ", ".join(registry.names("weight_loaders")) or "none"
        dist = plugin_for(arch)
        hint = (f"; install the plugin that supports it: pip install {dist}" if dist
                else "; no known plugin supports it (see docs/plugins for writing one)")
        raise ModelConfigError(f"no weight loader for architecture {arch!r} (registered: {known})"
                               f"{hint}")
    return registry.create("weight_loaders", arch, registry=registry)


def quant_method(config: dict) -> str | None:
    """The checkpoint's quantization method in lower case (``"fp8"``, ``"nvfp4"``), or None."""
    quant = config.get("quantization_config") or {}
    method = str(quant.get("quant_algo") or quant.get("quant_method") or "").lower()
    return method or None


def load_model(path_or_id: str | os.PathLike, backend: Any, *, dtype: Any = None,
               registry: Registry | None = None, revision: str | None = None,
               cache_dir: str | os.PathLike | None = None) -> CausalLM:
    """Resolve, read config.json, and load the model with its architecture's registered loader.

    Args:
        path_or_id: local directory or Hugging Face repo id.
        backend: a GpuBackend, or the registered name of one (``"numpy"``).
        dtype: activation/weight dtype (default: the config's ``torch_dtype``).
        registry: plugin registry (default: a fresh one with every installed plugin).
        revision, cache_dir: see :func:`~atlas_core.weights.resolve_model`.

    Raises:
        ModelNotFoundError, ModelConfigError, CheckpointError, WeightLoadError: with messages
        naming what was wrong and how to fix it (``UnsupportedQuantizationError``, a
        ``CheckpointError``, names a quantized format Atlas cannot load yet).
    """
    path = resolve_model(path_or_id, cache_dir=cache_dir, revision=revision)
    config = read_config(path)
    registry = registry if registry is not None else Registry()
    if isinstance(backend, str):
        backend = registry.create("gpu_backends", backend)
    loader = create_loader(registry, architecture(config))
    loader.validate_config(config)
    checkpoint = Checkpoint.open(path)
    check_supported(config, path, checkpoint.names())
    backend.bind_model(config.get("model_type"), quant_method(config))
    model = loader.load(config, checkpoint, backend, dtype=dtype)
    model.path = path
    return model
