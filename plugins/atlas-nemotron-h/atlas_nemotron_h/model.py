"""The Nemotron-H model tree: one-mixer blocks and checkpoint names under ``backbone.``."""

from __future__ import annotations

from typing import Any, Sequence

from atlas_core.api import CausalLM, DecoderLayer, TransformerLayer

#: Checkpoint prefixes of the model body: released checkpoints use ``backbone.``; HF
#: transformers renames it ``model.`` in memory.
PREFIXES = ("backbone.", "model.")


def nemotron_block(mixer: TransformerLayer, *, hidden_size: int, eps: float) -> DecoderLayer:
    """HF ``NemotronHBlock``: ``norm`` -> ``mixer`` (Mamba-2, attention, MLP or MoE), residual
    add fused into the next norm. A mixer-only :class:`DecoderLayer` whose input norm is read
    from the block's ``norm.weight``."""
    block = DecoderLayer(mixer, None, hidden_size=hidden_size, rms_norm_eps=eps,
                         mixer_name="mixer")
    block.declare("input_layernorm.weight", (hidden_size,), [("norm.weight", (hidden_size,))])
    return block


class NemotronHCausalLM(CausalLM):
    """:class:`CausalLM` over Nemotron-H blocks, its tensors named as the checkpoint names them:
    ``{prefix}embeddings.weight``, ``{prefix}layers.{i}.*``, ``{prefix}norm_f.weight`` and
    ``lm_head.weight``.

    Args:
        config, layers, **kwargs: as :class:`CausalLM`.
        prefix: ``"backbone."`` (released checkpoints) or ``"model."``.
    """

    def __init__(self, config: dict[str, Any], layers: Sequence[TransformerLayer], *,
                 prefix: str = "backbone.", **kwargs: Any) -> None:
        super().__init__(config, layers, **kwargs)
        if prefix not in PREFIXES:
            raise ValueError(f"unknown Nemotron-H tensor prefix {prefix!r}; use one of {PREFIXES}")
        hidden, vocab = self.hidden_size, self.vocab_size
        self.declare("model.embed_tokens.weight", (vocab, hidden),
                     [(f"{prefix}embeddings.weight", (vocab, hidden))])
        self.declare("model.norm.weight", (hidden,), [(f"{prefix}norm_f.weight", (hidden,))])
        self.children = {name.replace("model.layers.", f"{prefix}layers.", 1): child
                         for name, child in self.children.items()}
