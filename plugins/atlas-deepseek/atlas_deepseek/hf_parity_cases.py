"""HF-parity cases of the MLA families, imported only by tests (torch and transformers are
imported inside the functions that need them, never when this module is imported).

:func:`save_hf_checkpoint` (:mod:`atlas_core.testing.checkpoints`'s, imported here for the
tests that import it from this module) writes a tiny checkpoint with HF transformers itself;
:class:`MLAModelContract` is the HF-parity suite every MLA architecture's tests subclass
(atlas-deepseek for ``DeepseekV3ForCausalLM``, atlas-mistral for ``Mistral4ForCausalLM``),
setting :attr:`~MLAModelContract.architecture` and providing a ``registry`` fixture.

Tolerances (logits are O(1), max |logit| ~5 over a 384-token vocabulary):

- float32: max |atlas - HF| < 2e-5 over every position of prompts crossing 8-token KV blocks,
  expanded prefill and absorbed decode alike;
- greedy: 32 tokens identical to HF ``generate`` (float32);
- mixed batches, chunked prefill, a warm prefix cache and preemption equal one-shot runs
  (1e-5 in log-probabilities; identical greedy tokens through the engine);
- bfloat16 weights: mean |atlas - HF| < 0.03 (measured ~0.012; rounding can flip a near-tied
  expert choice).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from atlas_core.api import EngineArgs, LLMEngine, SamplingParams, load_model
from atlas_core.testing.checkpoints import hf_logits, save_hf_checkpoint
from atlas_core.testing.forward import ForwardRunner, logprobs, prefill_in_chunks

FP32_ATOL = 2e-5
BATCH_ATOL = 1e-5
BF16_MEAN_ATOL = 0.03
BLOCK = 8


def prompt(n: int, seed: int = 1) -> list[int]:
    """``n`` random ids below the tiny tokenizer's special tokens."""
    return np.random.default_rng(seed).integers(0, 377, n).tolist()


def engine_tokens(path: Path, prompts: list[list[int]], max_tokens: int = 6,
                  **kwargs: Any) -> tuple[list[list[int]], Any]:
    """Greedy tokens of ``prompts`` submitted together to a numpy engine, and its stats."""
    args = EngineArgs(model=str(path), backend="numpy", block_size=BLOCK,
                      **{"num_kv_blocks": 32, "max_num_seqs": 2, **kwargs})
    engine = LLMEngine.from_args(args)
    tokens: dict[str, list[int]] = {}
    for i, ids in enumerate(prompts):
        engine.add_request(f"r{i}", ids, SamplingParams(temperature=0, max_tokens=max_tokens,
                                                        ignore_eos=True))
    cached = 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                tokens[out.request_id] = list(out.outputs[0].token_ids)
                cached += out.num_cached_tokens
    return [tokens[f"r{i}"] for i in range(len(prompts))], (engine.stats(), cached, engine)


class MLAModelContract:
    """HF parity of one MLA architecture on a tiny float32 checkpoint saved by transformers.

    Subclasses set :attr:`architecture` (and :attr:`overrides` of the tiny config) and provide
    a session ``registry`` fixture with the architecture's loader.
    """

    architecture = ""
    overrides: dict[str, Any] = {}

    @pytest.fixture(scope="class")
    @classmethod
    def checkpoint(cls, registry, tmp_path_factory):
        pytest.importorskip("transformers")
        path = tmp_path_factory.mktemp(cls.architecture) / "fp32"
        return save_hf_checkpoint(path, cls.architecture, registry=registry, **cls.overrides)

    @pytest.fixture(scope="class")
    @classmethod
    def pair(cls, checkpoint, registry):
        torch = pytest.importorskip("torch")
        import transformers

        torch.set_num_threads(1)
        hf = getattr(transformers, cls.architecture).from_pretrained(checkpoint,
                                                                      dtype=torch.float32)
        return load_model(checkpoint, "numpy", registry=registry), hf.eval()

    def test_fp32_logits_match_hf_prefill_and_decode(self, pair):
        model, hf = pair
        runner = ForwardRunner(model, model.backend, max_seq_len=64, block_size=BLOCK)
        for n in (1, 7, 9, 40):
            ids = prompt(n, seed=n)
            runner.reset()
            got = runner.step([ids], all_logits=True)[0]
            np.testing.assert_allclose(got, hf_logits(hf, ids), rtol=0, atol=FP32_ATOL)
            decoded = runner.step([[3]], all_logits=True)[0]
            np.testing.assert_allclose(decoded, hf_logits(hf, ids + [3])[-1:], rtol=0,
                                       atol=FP32_ATOL)

    def test_greedy_32_tokens_match_hf_generate(self, pair):
        import torch

        model, hf = pair
        ids = prompt(14, seed=7)
        runner = ForwardRunner(model, model.backend, max_seq_len=64, block_size=BLOCK)
        got = runner.greedy([ids], num_tokens=32)[0]
        with torch.no_grad():
            out = hf.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False,
                              eos_token_id=None, pad_token_id=0)
        assert got == out[0, len(ids):].tolist()

    def test_mixed_batch_equals_each_alone(self, pair):
        model, _ = pair
        prompts = [prompt(n, seed=n) for n in (3, 17, 33, 1)]
        more = [[5], [9], prompt(6, seed=99)]
        runner = ForwardRunner(model, model.backend, max_seqs=4, max_seq_len=48, block_size=BLOCK)
        batched = runner.step(prompts, all_logits=True)
        mixed = runner.step(more, seq_ids=[0, 1, 2], all_logits=True)
        for i, (p, rows) in enumerate(zip(prompts, batched)):
            runner.reset()
            alone = runner.step([p], all_logits=True)[0]
            np.testing.assert_allclose(logprobs(rows), logprobs(alone), rtol=0, atol=BATCH_ATOL)
            if i < 3:
                after = runner.step([more[i]], all_logits=True)[0]
                np.testing.assert_allclose(logprobs(mixed[i]), logprobs(after), rtol=0,
                                           atol=BATCH_ATOL)

    def test_chunked_prefill_equals_one_shot(self, pair):
        model, _ = pair
        ids = prompt(45, seed=4)
        runner = ForwardRunner(model, model.backend, max_seq_len=64, block_size=BLOCK)
        one_shot = runner.step([ids], all_logits=True)[0]
        chunked = prefill_in_chunks(runner, ids, (7, 16, 17))
        np.testing.assert_allclose(logprobs(chunked), logprobs(one_shot), rtol=0, atol=BATCH_ATOL)

    def test_engine_warm_prefix_cache_equals_cold_and_hf(self, pair, checkpoint):
        import torch

        _, hf = pair
        ids = prompt(37, seed=11)
        (cold,), _ = engine_tokens(checkpoint, [ids], enable_prefix_caching=False)
        (first, second), (stats, cached, _) = engine_tokens(checkpoint, [ids, ids],
                                                            max_num_seqs=1)
        assert first == second == cold
        assert cached >= 32 and stats.prefix_cache_hits > 0
        with torch.no_grad():
            out = hf.generate(torch.tensor([ids]), max_new_tokens=6, do_sample=False,
                              eos_token_id=None, pad_token_id=0)
        assert cold == out[0, len(ids):].tolist()

    def test_engine_preemption_equals_alone(self, checkpoint):
        prompts = [prompt(30, seed=21), prompt(29, seed=22)]
        alone = [engine_tokens(checkpoint, [p], max_tokens=20)[0][0] for p in prompts]
        together, (stats, _, _) = engine_tokens(checkpoint, prompts, max_tokens=20,
                                                num_kv_blocks=10, enable_prefix_caching=False)
        assert stats.num_preemptions > 0
        assert together == alone

    def test_bf16_logits_close_to_hf(self, registry, tmp_path):
        import torch
        import transformers

        path = save_hf_checkpoint(tmp_path / "bf16", self.architecture, seed=5,
                                  dtype="bfloat16", registry=registry, **self.overrides)
        hf = getattr(transformers, self.architecture).from_pretrained(path, dtype=torch.bfloat16)
        model = load_model(path, "numpy", registry=registry)
        ids = prompt(24)
        got = ForwardRunner(model, model.backend, max_seq_len=32).step([ids], all_logits=True)[0]
        assert np.abs(got - hf_logits(hf.eval(), ids)).mean() < BF16_MEAN_ATOL

    def test_kv_cache_holds_the_latent_only(self, pair, checkpoint, caplog):
        model, _ = pair
        config = model.config
        latent = config["kv_lora_rank"] + config["qk_rope_head_dim"]
        with caplog.at_level(logging.INFO):
            _, (_, _, engine) = engine_tokens(checkpoint, [prompt(5)], max_tokens=1)
        per_token = config["num_hidden_layers"] * latent * 4
        assert f"{per_token} bytes per token" in caplog.text
        caches = engine.runner.kv_caches
        assert all(len(c) == 1 and c[0].shape == (32, BLOCK, 1, latent) for c in caches)
