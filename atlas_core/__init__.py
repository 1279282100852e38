"""Atlas core: plugin framework, op contract, reference backends, engine and server.

The public offline API is ``from atlas_core import LLM, SamplingParams``.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["LLM", "SamplingParams", "__version__"]


def __getattr__(name: str):
    # Imported lazily so `import atlas_core` stays cheap (CLI start-up, plugin discovery).
    if name == "LLM":
        from atlas_core.llm import LLM
        return LLM
    if name == "SamplingParams":
        from atlas_core.engine.sampling_params import SamplingParams
        return SamplingParams
    raise AttributeError(f"module 'atlas_core' has no attribute {name!r}")
