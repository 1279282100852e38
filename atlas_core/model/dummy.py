"""``--load-format dummy``: a model built from config.json alone, its weights random values made
on the device (vLLM's ``dummy`` load format).

Why: to time a model that the disk cannot hold or that was never downloaded (Qwen3-235B-A22B
in bf16 is 470 GB; the lent 4-GPU machines have 235 GB of disk), and to start big multi-GPU
runs in seconds. Nothing is read but config.json (and the tokenizer files, when the server
needs them); every rank of a parallel run fills only its own shard
(:func:`atlas_core.parallel.transform.build_random_shard`). The fill is
:func:`atlas_core.bench.random_model.fill_random_params`: the scales that keep activations
finite through the layers and, for a quantized config, the projections kept quantized in the
checkpoint's format, so the bytes a step reads are the real model's. The outputs are
meaningless: :data:`DUMMY_WARNING` says so wherever such a model is served.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

#: The line logged (and printed by ``atlas serve``) whenever dummy weights are loaded.
DUMMY_WARNING = ("--load-format dummy: the weights are RANDOM values (no checkpoint was read); "
                 "speed is the real model's, every output token is meaningless")


def dummy_model_dir(source: str | Path) -> Path:
    """The local directory holding ``source``'s config.json.

    A Hugging Face id is refused rather than resolved: resolving downloads the safetensors,
    the very files dummy weights exist to do without.

    Raises:
        ValueError: ``source`` is no directory with a config.json (says what to put there).
    """
    path = Path(source).expanduser()
    if not (path / "config.json").is_file():
        raise ValueError(f"--load-format dummy needs a local directory holding config.json "
                         f"(and tokenizer files to serve text); {source} is not one. Download "
                         "just those files, e.g. `hf download REPO config.json tokenizer.json "
                         "tokenizer_config.json --local-dir DIR`")
    return path


def load_dummy_model(source: str | Path, backend: Any, registry: Any = None, *,
                     dtype: Any = None, seed: int = 0) -> Any:
    """One GPU: the whole model of ``source``'s config.json with random weights on ``backend``.

    Args:
        source: a directory holding config.json (:func:`dummy_model_dir`).
        backend: a GpuBackend.
        registry: the plugin registry holding the architecture's loader (default: a fresh one).
        dtype: model dtype override (default: the config's, else bfloat16).
        seed: base seed of the fill.
    """
    from atlas_core.bench.random_model import build_random_model
    from atlas_core.model.loader import architecture, create_loader, quant_method, read_config
    from atlas_core.plugins import Registry
    path = dummy_model_dir(source)
    registry = registry if registry is not None else Registry()
    config = read_config(path)
    create_loader(registry, architecture(config)).validate_config(config)
    backend.bind_model(config.get("model_type"), quant_method(config))
    log.warning(DUMMY_WARNING)
    model = build_random_model(config, backend, registry, dtype=dtype, seed=seed)
    model.path = path
    return model
