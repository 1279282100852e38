"""A generic :class:`ModelWeightLoader` for Llama-style decoder stacks.

Model-family plugins subclass :class:`DecoderOnlyLoader` and override the few hooks where their
architecture differs (q/k norm, which layers are sparse, extra attention options), so a family
is usually a dozen lines. Layers are looked up by kind in the plugin registry, so another plugin
may replace how ``attention`` or ``moe`` is computed without touching the families.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from atlas_core.interfaces.layer import TransformerLayer
from atlas_core.interfaces.weight_loader import ModelWeightLoader
from atlas_core.model.config_fields import (canonical_config, head_dim_from_heads,
                                            kv_heads_from_heads)
from atlas_core.model.layers.decoder import DecoderLayer
from atlas_core.model.layers.mtp import MTPHead
from atlas_core.model.model import CausalLM
from atlas_core.model.quantized_loading import quantized_formats
from atlas_core.model.weight_loading import (check_size, checkpoint_tensors, load_weights,
                                             parameter_count, plan_weights)
from atlas_core.ops._dtypes import as_dtype
from atlas_core.ops.rotary import rope_parameters

REQUIRED_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")

#: config.json fields declaring multi-token-prediction blocks (Qwen3.5; Qwen3-Next, DeepSeek-V3).
MTP_LAYER_FIELDS = ("mtp_num_hidden_layers", "num_nextn_predict_layers")

#: Blocks built to size a model before all of it is built (the others are assumed alike).
SIZE_SAMPLE_LAYERS = 16


def model_dtype(config: dict[str, Any], dtype: Any = None, fallback: Any = None) -> np.dtype:
    """Activation dtype: ``dtype`` if given, else the config's ``torch_dtype``/``dtype``, else
    ``fallback``; fp8 storage dtypes become bfloat16 (the activation dtype of fp8 weights)."""
    chosen = dtype or config.get("torch_dtype") or config.get("dtype") or fallback or "bfloat16"
    np_dtype = as_dtype(chosen)
    return as_dtype("bfloat16") if np_dtype.itemsize == 1 else np_dtype


class DecoderOnlyLoader(ModelWeightLoader):
    """Builds embed -> N x (norm, attention, norm, mlp|moe) -> norm -> lm_head from config.json.

    Attributes:
        qk_norm: attention has per-head ``q_norm`` / ``k_norm`` (Qwen3).
        zero_centered_norm: every decoder and final RMSNorm weight is stored as ``w - 1``
            (Qwen3.5, Gemma).
        config_defaults: what a field absent from config.json means: the default of the
            architecture's HF config class (see
            :func:`~atlas_core.model.config_fields.canonical_config`).
    """

    qk_norm = False
    zero_centered_norm = False
    config_defaults: dict[str, Any] = {"head_dim": head_dim_from_heads,
                                       "num_key_value_heads": kv_heads_from_heads,
                                       "max_position_embeddings": 4096}

    def resolve_config(self, config: dict[str, Any]) -> dict[str, Any]:
        """``config`` with every field under the name this loader reads, absent ones defaulted."""
        return canonical_config(config, self.config_defaults)

    def layer_factory(self, kind: str) -> Any:
        """The factory registered as layer ``kind`` in the loader's registry."""
        return self.registry.get("layers", kind)

    def validate_config(self, config: dict[str, Any]) -> None:
        config = self.resolve_config(config)
        for name in REQUIRED_FIELDS:
            if not isinstance(config.get(name), int) or config[name] <= 0:
                raise ValueError(f"config.json field {name!r} must be a positive integer, got "
                                 f"{config.get(name)!r}")

    def head_dim(self, config: dict[str, Any]) -> int:
        return config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]

    def attention_kwargs(self, config: dict[str, Any], layer_idx: int) -> dict[str, Any]:
        """Keyword arguments of the ``attention`` layer for block ``layer_idx``."""
        bias = bool(config.get("attention_bias", False))
        return dict(hidden_size=config["hidden_size"], num_heads=config["num_attention_heads"],
                    num_kv_heads=config.get("num_key_value_heads") or config["num_attention_heads"],
                    head_dim=self.head_dim(config), rope=rope_parameters(config),
                    max_position_embeddings=self.max_position_embeddings(config),
                    rms_norm_eps=config.get("rms_norm_eps", 1e-6), qk_norm=self.qk_norm,
                    qkv_bias=bias, o_bias=bias)

    def is_sparse(self, config: dict[str, Any], layer_idx: int) -> bool:
        """Whether block ``layer_idx`` uses the ``moe`` feed-forward (default: never)."""
        return False

    def mlp_kwargs(self, config: dict[str, Any], layer_idx: int) -> dict[str, Any]:
        return dict(hidden_size=config["hidden_size"], intermediate_size=config["intermediate_size"],
                    hidden_act=config.get("hidden_act", "silu"), bias=bool(config.get("mlp_bias", False)))

    def moe_kwargs(self, config: dict[str, Any], layer_idx: int) -> dict[str, Any]:
        return dict(hidden_size=config["hidden_size"], num_experts=config["num_experts"],
                    num_experts_per_tok=config["num_experts_per_tok"],
                    moe_intermediate_size=config["moe_intermediate_size"],
                    norm_topk_prob=bool(config.get("norm_topk_prob", False)),
                    hidden_act=config.get("hidden_act", "silu"))

    def max_position_embeddings(self, config: dict[str, Any]) -> int:
        return int(config.get("max_position_embeddings") or 4096)

    def build_layer(self, config: dict[str, Any], layer_idx: int) -> TransformerLayer:
        """One decoder block: attention then the dense or sparse feed-forward."""
        attention = self.layer_factory("attention")(**self.attention_kwargs(config, layer_idx))
        if self.is_sparse(config, layer_idx):
            ffn = self.layer_factory("moe")(**self.moe_kwargs(config, layer_idx))
        else:
            ffn = self.layer_factory("mlp")(**self.mlp_kwargs(config, layer_idx))
        return DecoderLayer(attention, ffn, hidden_size=config["hidden_size"],
                            rms_norm_eps=config.get("rms_norm_eps", 1e-6),
                            zero_centered=self.zero_centered_norm)

    def build(self, config: dict[str, Any]) -> CausalLM:
        """The model tree for ``config``, parameters declared but not allocated."""
        config = self.resolve_config(config)
        self.validate_config(config)
        layers = [self.build_layer(config, i) for i in range(config["num_hidden_layers"])]
        return CausalLM(config, layers, hidden_size=config["hidden_size"],
                        vocab_size=config["vocab_size"], rms_norm_eps=config.get("rms_norm_eps", 1e-6),
                        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
                        max_position_embeddings=self.max_position_embeddings(config),
                        zero_centered_norm=self.zero_centered_norm)

    def build_mtp(self, config: dict[str, Any], model: CausalLM | None) -> MTPHead:
        """Optional. The multi-token-prediction head (``mtp.*``, see
        :class:`~atlas_core.model.layers.mtp.MTPHead`) over ``model``'s embedding table: one
        block built like block 0, with the loader's norms. Override where block 0 is not
        attention (hybrid stacks).

        Args:
            config: the resolved config.
            model: the model whose embedding the head shares (``None``: only declare shapes).
        """
        eps = config.get("rms_norm_eps", 1e-6)
        return MTPHead(self.build_layer(config, 0), hidden_size=config["hidden_size"],
                       rms_norm_eps=eps, zero_centered=self.zero_centered_norm,
                       embed_tokens=lambda: model.params["model.embed_tokens.weight"])

    def has_mtp_head(self, config: dict[str, Any], checkpoint: Any) -> bool:
        """Whether :meth:`load` attaches an MTP head as ``model.mtp``: config.json declares MTP
        blocks (:data:`MTP_LAYER_FIELDS`) and the checkpoint has ``mtp.fc.weight``
        ``[hidden, 2 * hidden]`` (the Qwen3.5 layout; its other ``mtp.*`` tensors must then be
        complete)."""
        config = self.resolve_config(config)
        if not any(config.get(field) for field in MTP_LAYER_FIELDS):
            return False
        hidden = config["hidden_size"]
        return ("mtp.fc.weight" in checkpoint
                and tuple(checkpoint.shape("mtp.fc.weight")) == (hidden, 2 * hidden))

    def parameter_count(self, config: dict[str, Any]) -> int:
        """Parameters of the model ``config`` describes, from its first
        :data:`SIZE_SAMPLE_LAYERS` blocks scaled to ``num_hidden_layers`` (fast for any config)."""
        config = self.resolve_config(config)
        num_layers = config["num_hidden_layers"]
        k = min(num_layers, SIZE_SAMPLE_LAYERS)
        sample = {**config, "num_hidden_layers": k}
        if isinstance(config.get("layer_types"), list):
            sample["layer_types"] = config["layer_types"][:k]
        blocks = sum(parameter_count(self.build_layer(sample, i)) for i in range(k))
        embeddings = config["vocab_size"] * config["hidden_size"]
        heads = 1 if config.get("tie_word_embeddings") else 2
        return embeddings * heads + config["hidden_size"] + blocks * num_layers // k

    def load(self, config: dict[str, Any], checkpoint: Any, backend: Any, *,
             dtype: Any = None) -> CausalLM:
        self.inspect_checkpoint(config, checkpoint)
        embed = "model.embed_tokens.weight"
        fallback = checkpoint.dtype(embed) if embed in checkpoint else None
        np_dtype = model_dtype(config, dtype, fallback)
        check_size(self.parameter_count(config), np_dtype, checkpoint, backend)
        model = self.build(config)
        if self.has_mtp_head(config, checkpoint):
            model.mtp = model.add("mtp", self.build_mtp(self.resolve_config(config), model))
        plan = plan_weights(model, checkpoint, config, quantized_formats(backend))
        model.materialize(backend, np_dtype, plan.allocate)
        load_weights(model, checkpoint, config, plan)
        return model

    def checkpoint_tensors(self, config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
        return checkpoint_tensors(self.build(config))
