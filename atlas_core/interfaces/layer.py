"""TransformerLayer: one decoder layer (or sub-block) computed over a batch of tokens."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

from atlas_core.interfaces.metadata import StepMetadata


@dataclass(frozen=True)
class KVCacheSpec:
    """Paged attention state a layer needs: one K and one V page pool.

    Pools are shaped ``[num_blocks, block_size, num_kv_heads, head_dim]``; the layer is bound a
    tuple of :attr:`num_pools` of them (K then V).
    """

    num_kv_heads: int
    head_dim: int
    #: Page pools per layer, each ``[num_blocks, block_size, num_kv_heads, head_dim]``.
    num_pools: ClassVar[int] = 2


@dataclass(frozen=True)
class LatentCacheSpec(KVCacheSpec):
    """Multi-head latent attention (MLA) state: one page pool of compressed latents.

    Each token keeps its normed latent (``kv_lora_rank`` features) followed by its rotated
    decoupled rope key (``rope_dim``): one pool ``[num_blocks, block_size, 1, kv_lora_rank +
    rope_dim]``, bound to the layer as a 1-tuple. KV sizing, prefix caching, preemption and the
    KV tiers count these bytes (``kv_lora_rank + rope_dim`` values per token per layer).
    Build it with :meth:`of`.
    """

    kv_lora_rank: int = 0
    rope_dim: int = 0
    num_pools: ClassVar[int] = 1

    @classmethod
    def of(cls, kv_lora_rank: int, rope_dim: int) -> "LatentCacheSpec":
        """The spec of a latent of ``kv_lora_rank`` features plus a ``rope_dim`` rope key."""
        return cls(num_kv_heads=1, head_dim=kv_lora_rank + rope_dim, kv_lora_rank=kv_lora_rank,
                   rope_dim=rope_dim)


@dataclass(frozen=True)
class SlidingWindowCacheSpec(KVCacheSpec):
    """Paged attention state of a layer whose queries read only the last ``sliding_window``
    positions (their own included).

    When a model also has full-attention layers, the engine keeps these layers' K/V in a pool
    of their own and frees its blocks once they fall behind every query's window (block table
    ``StepMetadata.window_block_tables``, slots ``window_slot_mapping``), so a long context costs
    the full-attention layers only. Without full-attention layers, or with KV tiers, they share
    the one pool and table like any :class:`KVCacheSpec`.
    """

    sliding_window: int = 0


@dataclass(frozen=True)
class RecurrentStateSpec:
    """Fixed-size per-sequence state (conv + SSM) for linear-attention / Mamba layers.

    Attributes:
        shapes: name -> per-sequence shape, e.g. ``{"conv": (3, 4096), "ssm": (32, 128, 128)}``.
        dtype: storage dtype name (``"float32"``, ``"bfloat16"``).
        prefill_bytes_per_token: device work memory a prefill token of this layer may need
            beyond its output (e.g. the float32 buffers of a chunked delta-rule kernel, shared
            by all layers); added to the activation reserve when the KV cache is sized.
        spec_verify: the layer runs speculative verify steps one query position at a time,
            each position's state in its own row (``meta.spec_state_rows`` /
            ``meta.spec_verify``; :func:`atlas_core.api.recurrent_verify`), so a rejected
            draft rolls back. Speculative decoding refuses a model with a recurrent layer
            that does not: its state would keep the rejected tokens.
    """

    shapes: dict[str, tuple[int, ...]]
    dtype: str = "float32"
    prefill_bytes_per_token: int = 0
    spec_verify: bool = False


class TransformerLayer(ABC):
    """A layer of a decoder stack.

    The generic model loop calls :meth:`forward` once per layer per step with the hidden states
    of every token in the batch (prefill chunks and decode rows mixed) and the residual stream.

    Required: :meth:`forward`. Optional: :meth:`forward_prenorm`, :meth:`state_spec`,
    :meth:`bind_state`.

    Attributes:
        ops: the backend's op table, set when the layer is materialised on a backend
            (:meth:`atlas_core.model.params.Module.materialize`).
    """

    ops: Any = None

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

    def forward_prenorm(self, hidden: Any, residual: Any | None, norm_weight: Any, eps: float,
                        zero_centered: bool, meta: StepMetadata) -> tuple[Any, Any]:
        """Optional. The block's RMSNorm (with its residual add) then :meth:`forward`, as one call.

        A pre-norm block (:class:`~atlas_core.model.layers.decoder.DecoderLayer`) calls this
        instead of ``rms_norm`` and :meth:`forward`, so a layer may fold the norm and the
        residual add into its first projection (``ops.rms_norm_linear``: one pass over the
        weight in batch-1 decode). An override must return what this default does.

        Args:
            hidden: ``[num_tokens, hidden_size]`` output of the previous sub-block.
            residual: ``[num_tokens, hidden_size]`` residual stream, or ``None`` at the first.
            norm_weight: ``[hidden_size]`` weight of the norm in front of this layer.
            eps: the norm's epsilon.
            zero_centered: ``norm_weight`` is stored as ``w - 1``.
            meta: per-step batch metadata.

        Returns:
            ``(out, residual)``: this layer's output over the normed input, and the new residual
            stream (``hidden + residual``, or ``hidden`` when ``residual`` is ``None``).
        """
        if residual is None:
            normed = self.ops.rms_norm(hidden, norm_weight, eps, zero_centered=zero_centered)
            residual = hidden
        else:
            normed, residual = self.ops.rms_norm(hidden, norm_weight, eps, residual,
                                                 zero_centered=zero_centered)
        out, _ = self.forward(normed, None, meta)
        return out, residual

    def state_spec(self) -> KVCacheSpec | RecurrentStateSpec | None:
        """Optional. The per-sequence state this layer keeps between steps (default none)."""
        return None

    def bind_state(self, state: Any) -> None:
        """Optional. Receive the state allocated for :meth:`state_spec` (KV pools, slots)."""
        self.state = state
