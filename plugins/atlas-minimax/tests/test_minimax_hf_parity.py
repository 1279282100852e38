"""MiniMaxM2ForCausalLM against HF transformers (torch CPU) on tiny checkpoints that
transformers itself saved (``block_sparse_moe.experts.{e}.w1/w2/w3``, full-width q/k norms,
``rotary_dim`` partial rotary, random non-zero ``e_score_correction_bias``).

Tolerances (logits are O(1), max |logit| ~4 over a 384-token vocabulary):
- float32: max |atlas - HF| < 2e-5 over every position of every prompt;
- greedy: 32 tokens identical to ``generate`` (float32);
- mixed batches and chunked prefill equal one-shot runs to 1e-5 in log-probabilities;
- bfloat16 weights: mean |diff| < 0.03 (rounding can flip a near-tied expert choice).
"""

from __future__ import annotations

import numpy as np
import pytest

from atlas_core.api import EngineArgs, LLMEngine, SamplingParams, load_model
from atlas_core.testing.checkpoints import hf_logits
from atlas_core.testing.forward import ForwardRunner, logprobs, prefill_in_chunks
from minimax_checkpoints import save_hf_checkpoint

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.reference
FP32_ATOL = 2e-5
BATCH_ATOL = 1e-5
BF16_MEAN_ATOL = 0.03


@pytest.fixture(scope="module")
def pair(checkpoint, registry):
    hf = transformers.MiniMaxM2ForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
    return load_model(checkpoint, "numpy", registry=registry), hf.eval()


def prompt(n: int, seed: int = 1) -> list[int]:
    return np.random.default_rng(seed).integers(0, 377, n).tolist()


def test_fp32_logits_match_hf(pair):
    model, hf = pair
    runner = ForwardRunner(model, model.backend, max_seq_len=64)
    for n in (1, 15, 17, 40):
        ids = prompt(n, seed=n)
        runner.reset()
        got = runner.step([ids], all_logits=True)[0]
        assert got.shape == (n, model.vocab_size)
        np.testing.assert_allclose(got, hf_logits(hf, ids), rtol=0, atol=FP32_ATOL)


def test_greedy_32_tokens_match_hf_generate(pair):
    model, hf = pair
    ids = prompt(14, seed=7)
    got = ForwardRunner(model, model.backend, max_seq_len=64).greedy([ids], num_tokens=32)[0]
    with torch.no_grad():
        out = hf.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False,
                          eos_token_id=None, pad_token_id=0)
    assert got == out[0, len(ids):].tolist()


def test_mixed_batch_equals_each_alone(pair):
    model, _ = pair
    prompts = [prompt(n, seed=n) for n in (3, 17, 33, 1)]
    runner = ForwardRunner(model, model.backend, max_seqs=4, max_seq_len=48)
    batched = runner.step(prompts, all_logits=True)
    # one step mixing decode rows (sequences 0, 1) with a prefill chunk (sequence 2)
    mixed = runner.step([[5], [9], prompt(6, seed=99)], seq_ids=[0, 1, 2], all_logits=True)
    for i, (p, rows) in enumerate(zip(prompts, batched)):
        runner.reset()
        alone = runner.step([p], all_logits=True)[0]
        np.testing.assert_allclose(logprobs(rows), logprobs(alone), rtol=0, atol=BATCH_ATOL)
        if i < 3:
            more = [[5], [9], prompt(6, seed=99)][i]
            after = runner.step([more], all_logits=True)[0]
            np.testing.assert_allclose(logprobs(mixed[i]), logprobs(after), rtol=0,
                                       atol=BATCH_ATOL)


def test_chunked_prefill_equals_one_shot(pair):
    model, _ = pair
    ids = prompt(45, seed=4)
    runner = ForwardRunner(model, model.backend, max_seq_len=64)
    one_shot = runner.step([ids], all_logits=True)[0]
    chunked = prefill_in_chunks(runner, ids, (7, 16, 17))
    np.testing.assert_allclose(logprobs(chunked), logprobs(one_shot), rtol=0, atol=BATCH_ATOL)


def _engine_tokens(path, ids: list[int], **kwargs) -> list[int]:
    args = EngineArgs(model=str(path), backend="numpy", num_kv_blocks=32, max_num_seqs=2,
                      block_size=8, **kwargs)
    engine = LLMEngine.from_args(args)
    engine.add_request("r", ids, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
    tokens: list[int] = []
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                tokens = list(out.outputs[0].token_ids)
    return tokens


def test_engine_chunked_prefill_equals_one_shot_and_hf(pair, checkpoint):
    _, hf = pair
    ids = prompt(37, seed=11)
    one_shot = _engine_tokens(checkpoint, ids, enable_prefix_caching=False)
    assert _engine_tokens(checkpoint, ids, max_prefill_tokens=8) == one_shot
    with torch.no_grad():
        out = hf.generate(torch.tensor([ids]), max_new_tokens=6, do_sample=False,
                          eos_token_id=None, pad_token_id=0)
    assert one_shot == out[0, len(ids):].tolist()


def test_correction_bias_changes_the_routing(pair, checkpoint, registry, tmp_path):
    """The bias is loaded and used: zeroing it changes the logits (HF's as well as ours)."""
    model, hf = pair
    ids = prompt(12, seed=3)
    with torch.no_grad():
        for layer in hf.model.layers:
            layer.mlp.e_score_correction_bias.zero_()
    hf.save_pretrained(tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((checkpoint / name).read_bytes())
    unbiased = load_model(tmp_path, "numpy", registry=registry)
    ours = ForwardRunner(unbiased, unbiased.backend, max_seq_len=16).step([ids], all_logits=True)
    np.testing.assert_allclose(ours[0], hf_logits(hf, ids), rtol=0, atol=FP32_ATOL)
    biased = ForwardRunner(model, model.backend, max_seq_len=16).step([ids], all_logits=True)
    assert np.abs(biased[0] - ours[0]).max() > 1e-2


def test_bf16_logits_close_to_hf(registry, tmp_path):
    path = save_hf_checkpoint(tmp_path / "bf16", seed=5, dtype="bfloat16", registry=registry)
    hf = transformers.MiniMaxM2ForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval()
    model = load_model(path, "numpy", registry=registry)
    ids = prompt(24)
    got = ForwardRunner(model, model.backend, max_seq_len=32).step([ids], all_logits=True)[0]
    assert np.abs(got - hf_logits(hf, ids)).mean() < BF16_MEAN_ATOL
