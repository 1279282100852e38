"""Mistral3ForConditionalGeneration (the text model of Mistral's multimodal checkpoints)
against HF transformers on tiny checkpoints transformers saved with a Pixtral vision tower
(skipped at load): a ``mistral4`` text model runs the whole MLA suite of
:mod:`atlas_deepseek.hf_parity_cases`; a dense ``mistral`` text model (Mistral-Small-3.x) is
built from core's layers and matches too (float32 logits within 2e-5). Ministral-3's
position-scaled queries are refused with a message naming the field."""

from __future__ import annotations

import numpy as np
import pytest

from atlas_core.api import load_model
from atlas_core.testing.forward import ForwardRunner
from atlas_deepseek.hf_parity_cases import (FP32_ATOL, MLAModelContract, prompt,
                                            save_hf_checkpoint)
from atlas_mistral.mistral3 import Mistral3Loader

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.reference

ARCH = "Mistral3ForConditionalGeneration"
DENSE_TEXT = {"model_type": "mistral", "hidden_size": 64, "intermediate_size": 96,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "head_dim": 16, "vocab_size": 384, "max_position_embeddings": 512,
              "rope_theta": 10000.0, "sliding_window": None, "tie_word_embeddings": False}


class TestMistral3WithMistral4Text(MLAModelContract):
    architecture = ARCH

    test_engine_preemption_equals_alone = None
    test_bf16_logits_close_to_hf = None
    test_chunked_prefill_equals_one_shot = None
    test_mixed_batch_equals_each_alone = None
    test_engine_warm_prefix_cache_equals_cold_and_hf = None


def test_dense_text_model_matches_hf(registry, tmp_path):
    torch.set_num_threads(1)
    path = save_hf_checkpoint(tmp_path / "dense", ARCH, registry=registry,
                              text_config=DENSE_TEXT)
    hf = transformers.Mistral3ForConditionalGeneration.from_pretrained(path, dtype=torch.float32)
    model = load_model(path, "numpy", registry=registry)
    ids = prompt(30, seed=2)
    got = ForwardRunner(model, model.backend, max_seq_len=32).step([ids], all_logits=True)[0]
    with torch.no_grad():
        want = hf.eval()(input_ids=torch.tensor([ids])).logits[0].numpy()
    np.testing.assert_allclose(got, want, rtol=0, atol=FP32_ATOL)


def test_ministral3_query_scaling_is_refused():
    text = {**DENSE_TEXT, "model_type": "ministral3",
            "rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6, "factor": 16.0,
                                "original_max_position_embeddings": 16384,
                                "llama_4_scaling_beta": 0.1}}
    with pytest.raises(ValueError, match="llama_4_scaling_beta"):
        Mistral3Loader().validate_config({**text, "architectures": [ARCH]})
