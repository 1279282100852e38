"""The Toy family: a Llama-shaped decoder whose config.json uses short field names.

It shows the usual shape of a model-family plugin: subclass the core's generic
:class:`~atlas_core.api.DecoderOnlyLoader`, translate the family's config into
the fields the built-in layers take, and give a ``tiny_config()`` so the test helpers can write a
random checkpoint of it.
"""

from __future__ import annotations

from typing import Any

from atlas_core.api import DecoderOnlyLoader

#: Toy config field -> the HF-style field the generic loader reads.
FIELDS = {
    "d_model": "hidden_size",
    "n_layers": "num_hidden_layers",
    "n_heads": "num_attention_heads",
    "n_kv_heads": "num_key_value_heads",
    "d_ff": "intermediate_size",
    "norm_eps": "rms_norm_eps",
}


def normalize(config: dict[str, Any]) -> dict[str, Any]:
    """Return ``config`` with Toy field names translated; the MLP is always GELU (tanh)."""
    out = {FIELDS.get(k, k): v for k, v in config.items()}
    out.setdefault("hidden_act", "gelu_pytorch_tanh")
    return out


class ToyLoader(DecoderOnlyLoader):
    """``ToyForCausalLM``: GQA attention (no q/k norm), GELU-gated MLP, untied head."""

    def validate_config(self, config: dict[str, Any]) -> None:
        super().validate_config(normalize(config))

    def build(self, config: dict[str, Any]):
        return super().build(normalize(config))

    def load(self, config: dict[str, Any], checkpoint: Any, backend: Any, *, dtype: Any = None):
        return super().load(normalize(config), checkpoint, backend, dtype=dtype)

    def tiny_config(self) -> dict[str, Any]:
        return {"architectures": ["ToyForCausalLM"], "model_type": "toy", "d_model": 48,
                "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "head_dim": 12, "d_ff": 96,
                "vocab_size": 320, "max_position_embeddings": 256, "norm_eps": 1e-6,
                "rope_theta": 10000.0, "tie_word_embeddings": False}
