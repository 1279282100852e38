"""Gemma-4 logits against HF transformers on tiny checkpoints that transformers saved itself.

Tiny model: 4 blocks (2 sliding with window 8, 2 full with their own head size 32, one KV head
and keys reused as values), final logit soft-cap 30; variants: the 26B-A4B MoE block, no k=v /
cap / tying, and ``Gemma3ForCausalLM`` (zero-centred norms, linear rope scaling on full layers).
Tolerances (logits are O(5)):
- float32: max |atlas - HF| < 1e-4 over every position of every prompt;
- greedy decoding: 32 tokens identical to ``model.generate`` (float32), prompts longer than the
  sliding window;
- mixed batch = each sequence alone, chunked prefill = one-shot prefill: max |diff| < 1e-5;
- bfloat16: logits are O(10), where one bf16 step is 0.06-0.125: mean |diff| < 0.08, max < 1.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
if not hasattr(transformers, "Gemma4ForCausalLM"):
    pytest.skip("this transformers has no Gemma-4", allow_module_level=True)

from atlas_core.api import Registry, load_model, make_plugin_manager  # noqa: E402
from atlas_core.testing.forward import ForwardRunner  # noqa: E402

from gemma4_checkpoints import MOE, as_conditional_generation, save_hf_checkpoint  # noqa: E402

pytestmark = pytest.mark.reference

FP32_ATOL = 1e-4
BF16_MEAN_ATOL, BF16_MAX_ATOL = 0.08, 1.0
VARIANTS = {"dense": {}, "moe": MOE,
            "plain": {"attention_k_eq_v": False, "final_logit_softcapping": None,
                      "tie_word_embeddings": False},
            "gemma3": {"gemma3": True}}


@pytest.fixture(scope="module")
def registry():
    return Registry(make_plugin_manager(allow=["gemma4"]))


@pytest.fixture(scope="module")
def pair(tmp_path_factory, registry):
    """(atlas model, HF model, checkpoint path) per variant, built once per module."""
    cache = {}

    def get(variant):
        if variant not in cache:
            path = tmp_path_factory.mktemp(variant)
            hf = save_hf_checkpoint(torch, transformers, path, **VARIANTS[variant])
            cache[variant] = (load_model(path, "numpy", registry=registry), hf, path)
        return cache[variant]
    return get


def _prompt(n, seed=1):
    return np.random.default_rng(seed).integers(0, 384, n).tolist()


def _hf_logits(hf, ids):
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0].float().numpy()


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_fp32_logits_match_hf(pair, variant):
    model, hf, _ = pair(variant)
    runner = ForwardRunner(model, model.backend, max_seq_len=48)
    for n in (1, 9, 40):
        ids = _prompt(n, seed=n)
        got = runner.step([ids], all_logits=True)[0]
        runner.reset()
        assert got.dtype == np.float32 and got.shape == (n, model.vocab_size)
        np.testing.assert_allclose(got, _hf_logits(hf, ids), rtol=0, atol=FP32_ATOL)


def test_moe_blocks_fold_the_per_expert_scale_into_down_proj(pair):
    """After loading, each MoE block's experts carry ``router.per_expert_scale`` in their
    ``down_proj`` (so the forward runs no ``mul_gathered``); the fp32 logits above match HF with
    the randomised scales (1 +- 0.1 noise)."""
    model, hf, _ = pair("moe")
    blocks = [m for m in model.modules() if getattr(m, "moe", None) is not None]
    assert blocks and all(b.moe.scale_folded for b in blocks)
    hf_layer = hf.model.layers[0]
    scale = hf_layer.router.per_expert_scale.detach().float().numpy()
    down = hf_layer.experts.down_proj.detach().float().numpy()
    np.testing.assert_allclose(blocks[0].params["experts.down_proj"],
                               down * scale[:, None, None], rtol=1e-6)


@pytest.mark.parametrize("variant", ["dense", "moe", "gemma3"])
def test_greedy_matches_hf_generate_past_the_window(pair, variant):
    model, hf, _ = pair(variant)
    prompt = _prompt(13, seed=7)
    got = ForwardRunner(model, model.backend, max_seq_len=48).greedy([prompt], num_tokens=32)[0]
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), max_new_tokens=32, do_sample=False,
                          eos_token_id=None, pad_token_id=0)
    assert got == out[0, len(prompt):].tolist()


def test_mixed_batch_equals_each_alone(pair):
    model, _, _ = pair("moe")
    prompts = [_prompt(n, seed=n) for n in (3, 17, 30, 1)]
    runner = ForwardRunner(model, model.backend, max_seqs=4, max_seq_len=32)
    batched = runner.step(prompts, all_logits=True)
    for prompt, rows in zip(prompts, batched):
        runner.reset()
        alone = runner.step([prompt], all_logits=True)[0]
        np.testing.assert_allclose(rows, alone, rtol=0, atol=1e-5)


def test_chunked_prefill_equals_one_shot(pair):
    model, _, _ = pair("dense")
    prompt = _prompt(37, seed=3)
    runner = ForwardRunner(model, model.backend, max_seq_len=48)
    one_shot = runner.step([prompt], all_logits=True)[0]
    runner.reset()
    chunks = [runner.step([prompt[i:i + 5]], all_logits=True)[0] for i in range(0, 37, 5)]
    np.testing.assert_allclose(np.concatenate(chunks), one_shot, rtol=0, atol=1e-5)


def test_conditional_generation_loads_the_text_model(pair, registry, tmp_path):
    """``Gemma4ForConditionalGeneration``: ``text_config`` and ``model.language_model.*``."""
    model, hf, path = pair("dense")
    wrapped = load_model(as_conditional_generation(path, tmp_path / "vl"), "numpy",
                         registry=registry)
    ids = _prompt(12, seed=9)
    got = ForwardRunner(wrapped, wrapped.backend, max_seq_len=16).step([ids], all_logits=True)[0]
    np.testing.assert_allclose(got, _hf_logits(hf, ids), rtol=0, atol=FP32_ATOL)


def test_bf16_logits_close_to_hf(registry, tmp_path):
    hf = save_hf_checkpoint(torch, transformers, tmp_path, dtype="bfloat16")
    model = load_model(tmp_path, "numpy", registry=registry)
    ids = _prompt(20, seed=4)
    got = ForwardRunner(model, model.backend, max_seq_len=32).step([ids], all_logits=True)[0]
    diff = np.abs(got - _hf_logits(hf, ids))
    assert diff.mean() < BF16_MEAN_ATOL and diff.max() < BF16_MAX_ATOL
