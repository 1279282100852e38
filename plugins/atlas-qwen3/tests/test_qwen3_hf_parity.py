"""Logits of tiny random checkpoints against HF transformers (torch CPU, test-only).

Tolerances (logits are O(1): std ~1 over a 384-token vocabulary):
- float32 checkpoints: max |atlas - HF| < 1e-4 over every position of every prompt.
- bfloat16 checkpoints: dense models max |diff| < 0.15; Qwen3-MoE mean |diff| < 0.03, because
  bf16 rounding can flip a near-tied expert choice at a few positions (then that row differs).
- greedy decoding: 32 tokens identical to ``model.generate`` (float32).
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from atlas_core.api import Registry, load_model, make_plugin_manager  # noqa: E402
from atlas_core.testing.checkpoints import write_tiny_checkpoint  # noqa: E402
from atlas_core.testing.forward import ForwardRunner  # noqa: E402

pytestmark = pytest.mark.reference

ARCHS = ["Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "LlamaForCausalLM", "MistralForCausalLM"]
FP32_ATOL = 1e-4
BF16_DENSE_ATOL = 0.15
BF16_MOE_MEAN_ATOL = 0.03


@pytest.fixture(scope="module")
def registry():
    return Registry(make_plugin_manager(allow=["qwen3"]))


@pytest.fixture(scope="module")
def pair(tmp_path_factory, registry):
    """(atlas model, HF model) per (architecture, dtype), built once per module."""
    cache = {}

    def get(arch, dtype="float32"):
        if (arch, dtype) not in cache:
            path = write_tiny_checkpoint(arch, tmp_path_factory.mktemp(arch), dtype=dtype,
                                         registry=registry)
            hf = transformers.AutoModelForCausalLM.from_pretrained(
                path, dtype=getattr(torch, dtype)).eval()
            cache[arch, dtype] = (load_model(path, "numpy", registry=registry), hf)
        return cache[arch, dtype]
    return get


def _prompt(n, seed=1):
    return np.random.default_rng(seed).integers(0, 377, n).tolist()


def _hf_logits(hf, ids):
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0].float().numpy()


@pytest.mark.parametrize("arch", ARCHS)
def test_fp32_logits_match_hf(pair, arch):
    model, hf = pair(arch)
    runner = ForwardRunner(model, model.backend, max_seq_len=64)
    for n in (1, 15, 16, 17, 40):
        ids = _prompt(n, seed=n)
        got = runner.step([ids], all_logits=True)[0]
        runner.reset()
        assert got.dtype == np.float32 and got.shape == (n, model.vocab_size)
        np.testing.assert_allclose(got, _hf_logits(hf, ids), rtol=0, atol=FP32_ATOL)


@pytest.mark.parametrize("arch", ARCHS)
def test_bf16_logits_close_to_hf(pair, arch):
    model, hf = pair(arch, "bfloat16")
    ids = _prompt(24)
    got = ForwardRunner(model, model.backend, max_seq_len=32).step([ids], all_logits=True)[0]
    diff = np.abs(got - _hf_logits(hf, ids))
    if arch.startswith("Qwen3Moe"):
        assert diff.mean() < BF16_MOE_MEAN_ATOL
    else:
        assert diff.max() < BF16_DENSE_ATOL


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_matches_hf_generate(pair, arch):
    model, hf = pair(arch)
    prompt = _prompt(14, seed=7)
    runner = ForwardRunner(model, model.backend, max_seq_len=64)
    got = runner.greedy([prompt], num_tokens=32)[0]
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), max_new_tokens=32, do_sample=False,
                          eos_token_id=None, pad_token_id=0)
    assert got == out[0, len(prompt):].tolist()


def _logprobs(logits):
    x = logits - logits.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


@pytest.mark.parametrize("arch", ["Qwen3ForCausalLM", "Qwen3MoeForCausalLM"])
def test_mixed_batch_equals_each_alone(pair, arch):
    model, _ = pair(arch)
    prompts = [_prompt(n, seed=n) for n in (3, 17, 33, 1)]
    runner = ForwardRunner(model, model.backend, max_seqs=4, max_seq_len=48)
    batched = runner.step(prompts, all_logits=True)
    for prompt, rows in zip(prompts, batched):
        runner.reset()
        alone = runner.step([prompt], all_logits=True)[0]
        np.testing.assert_allclose(_logprobs(rows), _logprobs(alone), rtol=0, atol=1e-5)


VARIANTS = [
    ("LlamaForCausalLM", {"attention_bias": True, "mlp_bias": True}),
    ("Qwen3ForCausalLM", {"tie_word_embeddings": True, "rope_scaling": {
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128}}),
    ("MistralForCausalLM", {"num_key_value_heads": 1}),
    ("Qwen3MoeForCausalLM", {"norm_topk_prob": False, "num_experts_per_tok": 3}),
]


@pytest.mark.parametrize("arch,overrides", VARIANTS, ids=[a for a, _ in VARIANTS])
def test_fp32_config_variants_match_hf(tmp_path, registry, arch, overrides):
    path = write_tiny_checkpoint(arch, tmp_path, registry=registry, seed=3, **overrides)
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    model = load_model(path, "numpy", registry=registry)
    ids = _prompt(20, seed=5)
    got = ForwardRunner(model, model.backend, max_seq_len=32).step([ids], all_logits=True)[0]
    np.testing.assert_allclose(got, _hf_logits(hf, ids), rtol=0, atol=FP32_ATOL)
