"""What ``LLMEngine.from_args`` loads: the backend, the model, its tokenizer and defaults."""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from atlas_core import env

log = logging.getLogger(__name__)

#: The built-in demo model shipped inside the package.
DEMO_MODEL_DIR = Path(__file__).resolve().parent.parent / "assets" / "atlas-demo"


class DemoModelMissingError(FileNotFoundError):
    """No model was named and the built-in demo model is not installed."""


@dataclass
class EngineParts:
    backend: Any
    model: Any
    tokenizer: Any
    path: Path | None
    generation_defaults: dict = field(default_factory=dict)


def gpu_present() -> bool:
    """Whether an NVIDIA driver is visible (checked without importing any CUDA library)."""
    return any(os.path.exists(p) for p in ("/proc/driver/nvidia/version", "/dev/nvidiactl"))


def default_backend_name(registry) -> str:
    """``ATLAS_BACKEND``, else ``cuda`` when registered and a GPU is present, else ``numpy``."""
    name = env.default_backend()
    if name:
        return name
    if "cuda" in registry.names("gpu_backends") and gpu_present():
        return "cuda"
    return "numpy"


def model_path_or_demo(model: str | None) -> str:
    """``model`` itself, or the demo model's directory when ``None`` (clear error if absent)."""
    if model is not None:
        return model
    if not (DEMO_MODEL_DIR / "config.json").is_file():
        raise DemoModelMissingError(
            f"no model given and the built-in demo model is missing ({DEMO_MODEL_DIR}); pass a "
            "model directory or Hugging Face id, e.g. `atlas generate Qwen/Qwen3-0.6B`")
    return str(DEMO_MODEL_DIR)


def create_backend(name: str | None, registry=None):
    """Instantiate the GpuBackend registered as ``name`` (default: :func:`default_backend_name`)."""
    from atlas_core.plugins import Registry
    registry = registry if registry is not None else Registry()
    return registry.create("gpu_backends", name or default_backend_name(registry)), registry


def generation_defaults(path: Path | None) -> dict:
    """Sampling defaults from ``generation_config.json`` (empty when absent or unreadable)."""
    if path is None or not (path / "generation_config.json").is_file():
        return {}
    try:
        config = json.loads((path / "generation_config.json").read_text())
    except (OSError, ValueError) as exc:
        log.warning("ignoring unreadable generation_config.json in %s: %s", path, exc)
        return {}
    if not config.get("do_sample", True):
        config["temperature"] = 0.0
    return {k: config[k] for k in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
            if isinstance(config.get(k), (int, float))}


def load_engine_parts(args, backend=None) -> EngineParts:
    """Backend, model, tokenizer and generation defaults for ``args``."""
    from atlas_core.model.loader import load_model
    registry = None
    if backend is None or isinstance(backend, str):
        backend, registry = create_backend(backend or args.backend)
    if getattr(args, "batch_invariant", False):
        # before load: the mode decides how quantized weights load (dequantized on cuda)
        backend.set_batch_invariant(True)
    if args.dequantize_weights:
        from atlas_core.model.quantized_loading import dequantize_all
        dequantize_all(backend)
    source = model_path_or_demo(args.model)
    start = time.perf_counter()
    log.info("loading %s on the %s backend", source, getattr(backend, "name", backend))
    if getattr(args, "load_format", "auto") == "dummy":
        from atlas_core.model.dummy import load_dummy_model
        model = load_dummy_model(source, backend, registry, dtype=args.dtype, seed=args.seed)
    else:
        model = load_model(source, backend, dtype=args.dtype, registry=registry,
                           revision=args.revision, cache_dir=args.cache_dir)
    log.info("model ready in %.1f s", time.perf_counter() - start)
    path = Path(getattr(model, "path", source))
    tokenizer = None
    if any((path / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")):
        from atlas_core.tokenizer import Tokenizer
        tokenizer = Tokenizer.from_dir(path)
    else:
        log.warning("no tokenizer files in %s: outputs will carry token ids only", path)
    return EngineParts(backend, model, tokenizer, path, generation_defaults(path))
