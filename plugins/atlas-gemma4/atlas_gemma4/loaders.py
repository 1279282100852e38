"""Weight loaders: ``Gemma4ForCausalLM`` and the text model of ``Gemma4ForConditionalGeneration``
(31B dense, 26B-A4B with the dense MLP and routed experts side by side)."""

from __future__ import annotations

from typing import Any

from atlas_core.api import DecoderOnlyLoader, checkpoint_tensors

from atlas_gemma4.decoder import Gemma4Experts
from atlas_gemma4.model import Gemma4CausalLM

#: HF's rope defaults per layer type (``Gemma4TextConfig``).
DEFAULT_ROPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                   "rope_theta": 1000000.0}}
SLIDING_PATTERN = 6
#: The plugin's own ops (:mod:`atlas_gemma4.ops`) every Gemma-4 model runs.
PLUGIN_OPS = ("mul", "softcap", "sliding_window_attention", "ffn_in", "ffn_out",
              "mul_gathered")


def default_layer_types(config: dict[str, Any]) -> list[str]:
    """Five sliding layers then one full one, repeated (``Gemma4TextConfig``'s default)."""
    return ["sliding_attention" if (i + 1) % SLIDING_PATTERN else "full_attention"
            for i in range(int(config.get("num_hidden_layers") or 0))]


class Gemma4Loader(DecoderOnlyLoader):
    """``Gemma4ForCausalLM``: sliding / full attention layers with their own head size, KV heads
    and rope; q/k/v norms; GeGLU; four norms per block and ``layer_scalar``; embeddings scaled by
    ``sqrt(hidden_size)``; optional final logit soft-capping and ``enable_moe_block`` experts.

    Not supported (refused with the field to change): per-layer input embeddings
    (``hidden_size_per_layer_input`` > 0, the E2B/E4B models), KV sharing
    (``num_kv_shared_layers`` > 0) and bidirectional attention.
    """

    config_defaults = {
        **DecoderOnlyLoader.config_defaults, "vocab_size": 262144, "hidden_size": 2304,
        "intermediate_size": 9216, "num_hidden_layers": 30, "num_attention_heads": 8,
        "num_key_value_heads": 4, "head_dim": 256, "global_head_dim": 512,
        "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "sliding_window": 512,
        "layer_types": default_layer_types, "rope_parameters": DEFAULT_ROPE,
        "final_logit_softcapping": None, "hidden_size_per_layer_input": 256,
        "attention_k_eq_v": False, "num_kv_shared_layers": 0, "enable_moe_block": False,
        "attention_bias": False}

    def validate_config(self, config: dict[str, Any]) -> None:
        super().validate_config(config)
        config = self.resolve_config(config)
        refused = {"hidden_size_per_layer_input": "per-layer input embeddings",
                   "num_kv_shared_layers": "KV sharing between layers",
                   "attention_bias": "attention biases"}
        for name, what in refused.items():
            if config.get(name):
                raise ValueError(f"config.json {name!r} = {config[name]!r}: {what} are not "
                                 f"supported by atlas-gemma4 yet; set it to 0 / false")
        if config.get("use_bidirectional_attention") == "all":
            raise ValueError("config.json 'use_bidirectional_attention': 'all' is not supported "
                             "(a causal language model needs causal attention)")
        if len(config["layer_types"]) != config["num_hidden_layers"]:
            raise ValueError(f"config.json 'layer_types' has {len(config['layer_types'])} "
                             f"entries for {config['num_hidden_layers']} layers")
        if config.get("enable_moe_block"):
            for name in ("num_experts", "top_k_experts", "moe_intermediate_size"):
                if not isinstance(config.get(name), int) or config[name] <= 0:
                    raise ValueError(f"config.json field {name!r} must be a positive integer "
                                     f"when enable_moe_block is true, got {config.get(name)!r}")

    def resolve_config(self, config: dict[str, Any]) -> dict[str, Any]:
        config = super().resolve_config(config)
        if config.get("moe_intermediate_size") is None and config.get("expert_intermediate_size"):
            config["moe_intermediate_size"] = config["expert_intermediate_size"]
        types = list(config["layer_types"])
        if types and types[-1] != "full_attention":
            types[-1] = "full_attention"
        config["layer_types"] = types
        return config

    def layer_shape(self, config: dict[str, Any], layer_idx: int) -> tuple[str, int, int]:
        """``(layer type, head_dim, num_kv_heads)`` of block ``layer_idx``.

        Full-attention layers take ``global_head_dim`` (and ``num_global_key_value_heads`` with
        ``attention_k_eq_v``), as released checkpoints write them; configs saved by
        transformers >= 5.6 carry the result instead, as ``per_layer_config[str(layer_idx)]``.
        """
        kind = config["layer_types"][layer_idx]
        if kind not in ("sliding_attention", "full_attention"):
            raise ValueError(f"config.json layer_types[{layer_idx}] = {kind!r}; expected "
                             "'sliding_attention' or 'full_attention'")
        head_dim, kv_heads = config["head_dim"], config["num_key_value_heads"]
        per_layer = config.get("per_layer_config")
        if isinstance(per_layer, dict):
            override = per_layer.get(str(layer_idx)) or per_layer.get(layer_idx) or {}
            return (kind, override.get("head_dim", head_dim),
                    override.get("num_key_value_heads", kv_heads))
        if kind == "sliding_attention":
            return kind, head_dim, kv_heads
        if config.get("attention_k_eq_v") and config.get("num_global_key_value_heads"):
            kv_heads = config["num_global_key_value_heads"]
        return kind, config.get("global_head_dim") or head_dim, kv_heads

    has_v_norm = True
    has_layer_scalar = True

    def attention_scale(self, config: dict[str, Any]) -> float:
        """Softmax scale: 1 (Gemma-4's q/k norms set the scale)."""
        return 1.0

    def rope(self, config: dict[str, Any], kind: str) -> dict[str, Any]:
        """Rope parameters of layer type ``kind``."""
        return {**DEFAULT_ROPE, **(config.get("rope_parameters") or {})}[kind]

    def build_layer(self, config: dict[str, Any], layer_idx: int) -> Any:
        kind, head_dim, kv_heads = self.layer_shape(config, layer_idx)
        sliding = kind == "sliding_attention"
        rope = self.rope(config, kind)
        attention = self.layer_factory("gemma4_attention")(
            hidden_size=config["hidden_size"], num_heads=config["num_attention_heads"],
            num_kv_heads=kv_heads, head_dim=head_dim, rope=rope,
            rms_norm_eps=config["rms_norm_eps"],
            sliding_window=int(config["sliding_window"]) if sliding else None,
            k_eq_v=bool(config.get("attention_k_eq_v")) and not sliding,
            scale=self.attention_scale(config), v_norm=self.has_v_norm,
            zero_centered=self.zero_centered_norm)
        act = config["hidden_activation"]
        mlp = self.layer_factory("mlp")(hidden_size=config["hidden_size"],
                                        intermediate_size=config["intermediate_size"],
                                        hidden_act=act)
        experts = None
        if config.get("enable_moe_block"):
            experts = Gemma4Experts(hidden_size=config["hidden_size"],
                                    num_experts=config["num_experts"],
                                    top_k=config["top_k_experts"],
                                    moe_intermediate_size=config["moe_intermediate_size"],
                                    hidden_act=act)
        return self.layer_factory("gemma4_decoder")(attention, mlp, experts,
                                                    hidden_size=config["hidden_size"],
                                                    rms_norm_eps=config["rms_norm_eps"],
                                                    layer_scalar=self.has_layer_scalar,
                                                    zero_centered=self.zero_centered_norm)

    def build(self, config: dict[str, Any]) -> Gemma4CausalLM:
        config = self.resolve_config(config)
        self.validate_config(config)
        layers = [self.build_layer(config, i) for i in range(config["num_hidden_layers"])]
        return Gemma4CausalLM(config, layers, hidden_size=config["hidden_size"],
                              vocab_size=config["vocab_size"], rms_norm_eps=config["rms_norm_eps"],
                              tie_word_embeddings=bool(config["tie_word_embeddings"]),
                              max_position_embeddings=self.max_position_embeddings(config),
                              zero_centered_norm=self.zero_centered_norm,
                              final_logit_softcapping=config.get("final_logit_softcapping"))

    def load(self, config: dict[str, Any], checkpoint: Any, backend: Any, *,
             dtype: Any = None) -> Gemma4CausalLM:
        """As :meth:`DecoderOnlyLoader.load`, after checking that ``backend`` has this plugin's
        ops (numpy; cuda with ``atlas-gemma4[cuda]``): refuse before allocating anything."""
        missing = [name for name in PLUGIN_OPS if name not in backend.ops]
        if missing:
            raise ValueError(f"Gemma-4 needs the ops {', '.join(missing)}, which this backend "
                             "does not implement (atlas-gemma4 ships them for the numpy and "
                             "cuda backends); run it with the numpy backend, or install "
                             "atlas-gemma4[cuda] for cuda")
        return super().load(config, checkpoint, backend, dtype=dtype)

    def checkpoint_tensors(self, config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
        """Tensor names and shapes; a multimodal wrapper's (``text_config``) under
        ``model.language_model.``."""
        text = config.get("text_config")
        if not isinstance(text, dict):
            return checkpoint_tensors(self.build(config))
        return {("model.language_model." + n[len("model."):] if n.startswith("model.") else n): s
                for n, s in checkpoint_tensors(self.build(text)).items()}

    def tiny_config(self) -> dict[str, Any]:
        return {"architectures": ["Gemma4ForCausalLM"], "model_type": "gemma4_text",
                "vocab_size": 384, "hidden_size": 64, "intermediate_size": 128,
                "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
                "head_dim": 16, "global_head_dim": 32, "num_global_key_value_heads": 1,
                "attention_k_eq_v": True, "hidden_activation": "gelu_pytorch_tanh",
                "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "sliding_window": 8,
                "layer_types": ["sliding_attention", "sliding_attention", "full_attention",
                                "full_attention"],
                "rope_parameters": DEFAULT_ROPE, "final_logit_softcapping": 30.0,
                "hidden_size_per_layer_input": 0, "num_kv_shared_layers": 0,
                "tie_word_embeddings": True, "initializer_range": 0.02}


def wrapper_config(text: dict[str, Any], architecture: str, model_type: str) -> dict[str, Any]:
    """A multimodal wrapper config around a tiny text config (no vision or audio tower)."""
    text = {k: v for k, v in text.items() if k != "architectures"}
    return {"architectures": [architecture], "model_type": model_type, "text_config": text,
            "vocab_size": text["vocab_size"], "tie_word_embeddings": True,
            "max_position_embeddings": text["max_position_embeddings"]}


class Gemma4VLLoader(Gemma4Loader):
    """``Gemma4ForConditionalGeneration``: the text model (``text_config``,
    ``model.language_model.*``); the vision and audio towers are skipped."""

    def tiny_config(self) -> dict[str, Any]:
        return wrapper_config(super().tiny_config(), "Gemma4ForConditionalGeneration", "gemma4")

