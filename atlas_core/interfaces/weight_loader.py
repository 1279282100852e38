"""ModelWeightLoader: turns an HF config + checkpoint into a runnable model."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from atlas_core.model.model import CausalLM
    from atlas_core.plugins import Registry
    from atlas_core.weights.checkpoint import Checkpoint


class ModelWeightLoader(ABC):
    """Builds a :class:`~atlas_core.model.model.CausalLM` for one HF architecture.

    Parameter names mirror the HF checkpoint; the loader walks the checkpoint's tensors and hands
    each to the layer parameter it belongs to, validating shapes with errors that name the tensor.

    The factory registered with ``register_weight_loaders`` is called with one keyword,
    ``registry``: the :class:`~atlas_core.plugins.Registry` it was found in, where the loader
    looks up the layer kinds it builds (so another plugin may supply ``attention`` or ``moe``).

    Required: :meth:`load`. Optional: :meth:`validate_config`, :meth:`inspect_checkpoint`,
    :meth:`tiny_config`, :meth:`checkpoint_tensors`.

    Args:
        registry: the registry that created the loader; ``None`` (a loader made by hand) means
            a fresh one with every installed plugin, built on first use.
    """

    #: Optional. Sampling defaults per mode the model card recommends, e.g.
    #: ``{"thinking": {"temperature": 0.6, "top_p": 0.95}, "tool_calls": {...}}`` (modes and
    #: fields: :mod:`atlas_core.engine.sampling_presets`); None: only generation_config.json.
    sampling_presets: dict | None = None

    def __init__(self, registry: "Registry | None" = None) -> None:
        self._registry = registry

    @property
    def registry(self) -> "Registry":
        """The plugin registry this loader looks layer kinds up in."""
        if self._registry is None:
            from atlas_core.plugins import Registry  # discovery only for loaders made by hand

            self._registry = Registry()
        return self._registry

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

    def inspect_checkpoint(self, config: dict[str, Any], checkpoint: "Checkpoint") -> None:
        """Optional. Read what config.json does not say off the checkpoint's tensor names
        (e.g. which prefix the model body is saved under) before the model is built.

        Called by :meth:`load` of the generic loaders and by the tensor-parallel loader
        (:func:`atlas_core.parallel.transform.load_shard`), which builds the model without
        :meth:`load`; keep it cheap (names and headers only). Default: nothing.

        Since: issue #26.
        """

    def tiny_config(self) -> dict[str, Any] | None:
        """Optional. A config.json dict for a tiny random test model of this architecture.

        Used by :func:`atlas_core.testing.checkpoints.write_tiny_checkpoint` (hidden ~64, 2-4
        layers, vocab ~300-512). ``None`` (the default) means the loader offers no tiny model.
        """
        return None

    def checkpoint_tensors(self, config: dict[str, Any]) -> dict[str, tuple[int, ...]] | None:
        """Optional. HF tensor name -> shape of every tensor :meth:`load` reads for ``config``.

        Used to write tiny random checkpoints; ``None`` (the default) means unknown.
        """
        return None
