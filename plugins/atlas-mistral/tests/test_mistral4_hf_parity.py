"""Mistral4ForCausalLM against HF transformers (torch CPU) on a tiny checkpoint transformers
itself saved: MLA with q_lora_rank and interleaved rope, yarn (x32 over 16 positions) with
mscale_all_dim in the softmax scale, Llama-4 query scaling by position (beta 0.1 past 16
tokens), softmax routing over 2 groups top-1 with routed_scaling_factor 1.5, a shared expert
and one dense block first. Tolerances: see :mod:`atlas_deepseek.hf_parity_cases`."""

from __future__ import annotations

import json

import numpy as np
import pytest

from atlas_core.api import load_model
from atlas_core.testing.forward import ForwardRunner
from atlas_deepseek.hf_parity_cases import FP32_ATOL, MLAModelContract, prompt
from atlas_mistral.loader import Mistral4Loader

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytestmark = pytest.mark.reference


class TestMistral4(MLAModelContract):
    architecture = "Mistral4ForCausalLM"

    def test_llama4_scaling_is_applied(self, pair, checkpoint, registry, tmp_path):
        """Without the query scaling the logits past ``original_max_position_embeddings`` move
        (so the parity above exercises it), while the first 16 positions do not."""
        model, hf = pair
        config = json.loads((checkpoint / "config.json").read_text())
        config["rope_parameters"]["llama_4_scaling_beta"] = 0.0
        for name in ("model.safetensors", "tokenizer.json", "tokenizer_config.json"):
            (tmp_path / name).write_bytes((checkpoint / name).read_bytes())
        (tmp_path / "config.json").write_text(json.dumps(config))
        unscaled = load_model(tmp_path, "numpy", registry=registry)
        ids = prompt(30, seed=5)
        runs = [ForwardRunner(m, m.backend, max_seq_len=32).step([ids], all_logits=True)[0]
                for m in (model, unscaled)]
        np.testing.assert_allclose(runs[0][:16], runs[1][:16], rtol=0, atol=FP32_ATOL)
        assert np.abs(runs[0][16:] - runs[1][16:]).max() > 1e-3


def test_config_defaults_follow_hf_mistral4_config():
    transformers = pytest.importorskip("transformers")
    loader = Mistral4Loader()
    config = loader.resolve_config({"architectures": ["Mistral4ForCausalLM"], "hidden_size": 64,
                                    "num_hidden_layers": 1, "num_attention_heads": 4,
                                    "vocab_size": 32})
    hf = transformers.Mistral4Config()
    for name in ("kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim",
                 "v_head_dim", "n_group", "topk_group", "num_experts_per_tok",
                 "first_k_dense_replace", "routed_scaling_factor", "moe_intermediate_size"):
        assert config[name] == getattr(hf, name), name
    assert config["num_experts"] == hf.n_routed_experts
    assert loader.llama4_scaling_beta(config) == hf.rope_parameters["llama_4_scaling_beta"]
    kwargs = loader.attention_kwargs(config, 0)
    assert kwargs["rope"]["rope_type"] == "yarn" and kwargs["rope"]["factor"] == 128.0
