"""The model: :class:`CausalLM` generic loop, built-in layers, :func:`load_model`.

Exports resolve lazily, so importing the package imports no layer, op or checkpoint code.
"""

from typing import Any

_EXPORTS = {
    "CausalLM": "atlas_core.model.model",
    "DecoderOnlyLoader": "atlas_core.model.decoder_loader",
    "StepMetadata": "atlas_core.interfaces.metadata",
    "WeightLoadError": "atlas_core.model.weight_loading",
    "ModelConfigError": "atlas_core.model.loader",
    "load_model": "atlas_core.model.loader",
    "read_config": "atlas_core.model.loader",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'atlas_core.model' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_EXPORTS[name]), name)
