"""ModelWeightLoader: turns an HF config + checkpoint into a runnable model."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from atlas_core.model.model import CausalLM
    from atlas_core.weights.checkpoint import Checkpoint


class ModelWeightLoader(ABC):
    """Builds a :class:`~atlas_core.model.model.CausalLM` for one HF architecture.

    Parameter names mirror the HF checkpoint; the loader walks the checkpoint's tensors and hands
    each to the layer parameter it belongs to, validating shapes with errors that name the tensor.

    Required: :meth:`load`. Optional: :meth:`validate_config`, :meth:`default_generation`.
    """

    @abstractmethod
    def load(self, config: dict[str, Any], checkpoint: "Checkpoint", backend: Any, *,
             dtype: Any = None) -> "CausalLM":
        """Load the model onto ``backend``.

        Args:
            config: the parsed ``config.json`` (for multimodal wrappers, the text config).
            checkpoint: tensor source (mmap'd safetensors).
            backend: a :class:`~atlas_core.interfaces.GpuBackend`.
            dtype: activation/weight dtype override (default: the checkpoint's ``torch_dtype``).
        """

    def validate_config(self, config: dict[str, Any]) -> None:
        """Optional. Raise ``ValueError`` naming the field when the config is unsupported."""
