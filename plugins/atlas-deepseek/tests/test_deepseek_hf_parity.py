"""DeepseekV3ForCausalLM against HF transformers (torch CPU) on tiny checkpoints transformers
itself saved: q_lora_rank with interleaved rope (V3) and a plain q_proj with rotate-half rope
(V2-Lite style); yarn with mscale_all_dim changes the softmax scale; sigmoid routing with a
random e_score_correction_bias, 4 groups top-2, routed_scaling_factor 2.5, a shared expert and
one dense block first. Tolerances: see :mod:`atlas_deepseek.hf_parity_cases`."""

from __future__ import annotations

import pytest

from atlas_deepseek.hf_parity_cases import MLAModelContract

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytestmark = pytest.mark.reference


class TestDeepseekV3(MLAModelContract):
    architecture = "DeepseekV3ForCausalLM"


class TestDeepseekV3PlainQuery(MLAModelContract):
    architecture = "DeepseekV3ForCausalLM"
    overrides = {"q_lora_rank": None, "rope_interleave": False, "n_group": 1, "topk_group": 1}

    test_mixed_batch_equals_each_alone = None
    test_chunked_prefill_equals_one_shot = None
    test_engine_warm_prefix_cache_equals_cold_and_hf = None
    test_engine_preemption_equals_alone = None
    test_bf16_logits_close_to_hf = None
    test_kv_cache_holds_the_latent_only = None
