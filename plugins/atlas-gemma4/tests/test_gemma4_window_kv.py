"""Gemma's sliding layers keep only their window in the KV cache (engine/window_blocks.py): the
engine gives them a pool of their own, frees blocks that fall behind the window of 8, and
still decodes what HF transformers decodes (32 greedy tokens, prompts of 3-4 windows, blocks of
4 tokens, prefill chunks of 16); a prefix hit after the window moved on, and preemption, give
the same tokens."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
if not hasattr(transformers, "Gemma4ForCausalLM"):
    pytest.skip("this transformers has no Gemma-4", allow_module_level=True)

from atlas_core.api import LLM, SamplingParams  # noqa: E402
from atlas_core.testing.tiny_tokenizer import write_tokenizer  # noqa: E402

from gemma4_checkpoints import save_hf_checkpoint  # noqa: E402

BLOCK, WINDOW = 4, 8
#: Window-table entry of a block given back (``atlas_core.engine.window_blocks.NO_BLOCK``).
NO_BLOCK = -1
GREEDY = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("gemma4-window")
    hf = save_hf_checkpoint(torch, transformers, path, seed=11)
    write_tokenizer(path, 384)
    return path, hf


def _llm(path, **kw):
    return LLM(str(path), backend="numpy", block_size=BLOCK, max_prefill_tokens=16,
               max_num_seqs=4, **{"num_kv_blocks": 64, **kw})


def _hf_greedy(hf, prompt, n=32):
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False,
                          eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def _prompt(n, seed):
    return np.random.default_rng(seed).integers(0, 384, n).tolist()


def test_sliding_layers_get_a_small_pool_of_their_own(checkpoint):
    engine = _llm(checkpoint[0]).engine
    kv, runner = engine.kv_config, engine.runner
    assert type(engine.block_manager).__name__ == "WindowedBlockManager"
    assert kv.window_pool.window == WINDOW
    # full layers: 1 KV head of 32, K and V, float32; the two sliding layers are not counted
    assert kv.bytes_per_block == 2 * (2 * 1 * 32 * 4) * BLOCK
    assert kv.window_pool.bytes_per_block == 2 * (2 * 2 * 16 * 4) * BLOCK
    pools = [caches[0].shape[0] for caches in runner.kv_caches]
    assert pools == [kv.window_pool.num_blocks] * 2 + [kv.num_blocks] * 2


def test_greedy_equals_hf_while_blocks_behind_the_window_are_freed(checkpoint):
    path, hf = checkpoint
    llm = _llm(path)
    engine, prompt = llm.engine, _prompt(30, seed=1)
    engine.add_request("a", prompt, GREEDY)
    freed = 0
    final = None
    while engine.has_unfinished_requests():
        for out in engine.step():
            final = out
        for seq in engine.scheduler.running:
            held = [b for b in seq.window_block_table if b != NO_BLOCK]
            assert len(held) <= -(-(WINDOW - 1 + 16) // BLOCK) + 1
            freed = max(freed, seq.window_block_table.count(NO_BLOCK))
    assert freed >= (30 + 31 - WINDOW) // BLOCK - 1
    assert final.outputs[0].token_ids == _hf_greedy(hf, prompt)


def test_a_prefix_hit_after_freeing_decodes_as_hf(checkpoint):
    path, hf = checkpoint
    llm, prompt = _llm(path), _prompt(26, seed=2)
    llm.generate([{"prompt_token_ids": prompt}], GREEDY)
    longer = prompt + _prompt(5, seed=3)
    out = llm.generate([{"prompt_token_ids": longer}], GREEDY)[0]
    assert out.num_cached_tokens == 24
    assert out.outputs[0].token_ids == _hf_greedy(hf, longer)


def test_preemption_recomputes_the_same_tokens(checkpoint):
    path, hf = checkpoint
    llm = _llm(path, num_kv_blocks=20)
    prompts = [_prompt(n, seed=n) for n in (22, 17, 25)]
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    assert llm.engine.scheduler.num_preemptions > 0
    for prompt, out in zip(prompts, outs):
        assert out.outputs[0].token_ids == _hf_greedy(hf, prompt, 16)
