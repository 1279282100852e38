"""TransformerLayer: one decoder layer (or sub-block) computed over a batch of tokens."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from atlas_core.model.metadata import StepMetadata


@dataclass(frozen=True)
class KVCacheSpec:
    """Paged attention state a layer needs: one K and one V page pool.

    Pools are shaped ``[num_blocks, block_size, num_kv_heads, head_dim]``.
    """

    num_kv_heads: int
    head_dim: int


@dataclass(frozen=True)
class RecurrentStateSpec:
    """Fixed-size per-sequence state (conv + SSM) for linear-attention / Mamba layers.

    Attributes:
        shapes: name -> per-sequence shape, e.g. ``{"conv": (3, 4096), "ssm": (32, 128, 128)}``.
        dtype: storage dtype name (``"float32"``, ``"bfloat16"``).
        prefill_bytes_per_token: device work memory a prefill token of this layer may need
            beyond its output (e.g. the float32 buffers of a chunked delta-rule kernel, shared
            by all layers); added to the activation reserve when the KV cache is sized.
    """

    shapes: dict[str, tuple[int, ...]]
    dtype: str = "float32"
    prefill_bytes_per_token: int = 0


class TransformerLayer(ABC):
    """A layer of a decoder stack.

    The generic model loop calls :meth:`forward` once per layer per step with the hidden states
    of every token in the batch (prefill chunks and decode rows mixed) and the residual stream.

    Required: :meth:`forward`. Optional: :meth:`state_spec`, :meth:`bind_state`.
    """

    @abstractmethod
    def forward(self, hidden: Any, residual: Any | None, meta: StepMetadata) -> tuple[Any, Any]:
        """Compute the layer.

        Args:
            hidden: ``[num_tokens, hidden_size]`` output of the previous layer.
            residual: ``[num_tokens, hidden_size]`` residual stream, or ``None`` for the first layer.
            meta: per-step batch metadata (positions, block tables, slot mapping…).

        Returns:
            ``(hidden, residual)`` for the next layer.
        """

    def state_spec(self) -> KVCacheSpec | RecurrentStateSpec | None:
        """Optional. The per-sequence state this layer keeps between steps (default none)."""
        return None

    def bind_state(self, state: Any) -> None:
        """Optional. Receive the state allocated for :meth:`state_spec` (KV pools, slots)."""
        self.state = state
