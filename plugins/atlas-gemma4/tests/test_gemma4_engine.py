"""The engine serves Gemma-4 as the plain forward loop does: three requests at once, prefill
chunked at 16 tokens (prompts longer than the sliding window of 8), prefix caching on."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
if not hasattr(transformers, "Gemma4ForCausalLM"):
    pytest.skip("this transformers has no Gemma-4", allow_module_level=True)

from atlas_core.api import LLM, SamplingParams, load_model  # noqa: E402
from atlas_core.testing.forward import ForwardRunner  # noqa: E402
from atlas_core.testing.tiny_tokenizer import write_tokenizer  # noqa: E402

from gemma4_checkpoints import MOE, save_hf_checkpoint  # noqa: E402


@pytest.mark.parametrize("variant", [{}, MOE], ids=["dense", "moe"])
def test_engine_greedy_equals_the_forward_loop(tmp_path, variant):
    save_hf_checkpoint(torch, transformers, tmp_path, seed=5, **variant)
    write_tokenizer(tmp_path, 384)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 300, n).tolist() for n in (13, 30, 5)]
    llm = LLM(str(tmp_path), backend="numpy", max_prefill_tokens=16, num_kv_blocks=64)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                           SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    model = load_model(tmp_path, "numpy")
    runner = ForwardRunner(model, model.backend, max_seq_len=48)
    for prompt, output in zip(prompts, outputs):
        assert output.outputs[0].token_ids == runner.greedy([prompt], 12)[0]
