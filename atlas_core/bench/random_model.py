"""Random-weight models built straight on the device: no checkpoint is written or read.

A named shape's config goes through its registered loader's ``build`` (the same model tree a
checkpoint would fill), every parameter is allocated with ``materialize`` and then overwritten
in place by :meth:`~atlas_core.interfaces.GpuBackend.fill_random`, so a 60 GB model is ready
in seconds on a GPU and never touches the disk.
"""

from __future__ import annotations

import math
from typing import Any

from atlas_core.model.decoder_loader import model_dtype
from atlas_core.model.loader import architecture, create_loader


def param_scale(name: str, shape: tuple[int, ...]) -> tuple[float, float]:
    """``(mean, std)`` of a random parameter: vectors (norm weights, biases, gate constants)
    near one, the embedding table of unit scale, matrices ``1 / sqrt(fan_in)`` so activations
    neither vanish nor overflow through the layers."""
    if len(shape) == 1:
        return 1.0, 0.05
    if name.endswith("embed_tokens.weight"):
        return 0.0, 1.0
    return 0.0, 1.0 / math.sqrt(shape[-1])


def fill_random_params(model: Any, backend: Any, seed: int = 0) -> int:
    """Overwrite every parameter of a materialized model; returns the bytes filled."""
    total = 0
    for i, (name, module, local, spec) in enumerate(model.named_specs()):
        array = module.params[local]
        mean, std = param_scale(name, spec.shape)
        backend.fill_random(array, seed * 1_000_003 + i, std, mean)
        total += array.nbytes
    return total


def build_random_model(config: dict[str, Any], backend: Any, registry: Any, *,
                       dtype: str | None = None, seed: int = 0) -> Any:
    """The model of ``config`` on ``backend`` with random weights (see the module docstring).

    Args:
        config: a config.json dict (e.g. :func:`~atlas_core.bench.shapes.shape_config`).
        backend: a GpuBackend.
        registry: the plugin registry holding the architecture's weight loader.
        dtype: weight/activation dtype (default: the config's, else bfloat16).
        seed: base seed; parameter ``i`` is filled with seed ``seed * 1000003 + i``.
    """
    loader = create_loader(registry, architecture(config))
    model = loader.build(config)
    model.materialize(backend, model_dtype(config, dtype))
    fill_random_params(model, backend, seed)
    backend.synchronize()
    return model
