"""Sliding-window freeing and KV tiers together (engine/window_blocks.py, kv_tiers.py) on a tiny
Gemma-4 (window 8, blocks of 4, numpy backend): a long prompt's full-attention blocks and the
window blocks it resumes from, evicted from both device pools, come back from host memory and
from disk (after a restart too) and decode what a cold run decodes."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
if not hasattr(transformers, "Gemma4ForCausalLM"):
    pytest.skip("this transformers has no Gemma-4", allow_module_level=True)

from atlas_core.api import EngineArgs, LLMEngine, SamplingParams  # noqa: E402
from atlas_core.testing.fake_model import (assert_same_output, run_one,  # noqa: E402
                                           run_to_completion)
from atlas_core.testing.tiny_tokenizer import write_tokenizer  # noqa: E402

from gemma4_checkpoints import save_hf_checkpoint  # noqa: E402

pytestmark = pytest.mark.timeout(240)

BLOCK, WINDOW, LENGTH = 4, 8, 42
#: Tokens of the 42-token prompt served from the cache: every full block but the last token's.
CACHED = (LENGTH - 1) // BLOCK * BLOCK
#: Window blocks a query at position CACHED reads (positions CACHED - WINDOW + 1 .. CACHED - 1).
NUM_WINDOW_BLOCKS = CACHED // BLOCK - (CACHED - WINDOW + 1) // BLOCK
GREEDY = SamplingParams(temperature=0, max_tokens=8, logprobs=3, ignore_eos=True)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("gemma4-window-tiers")
    save_hf_checkpoint(torch, transformers, path, seed=5)
    write_tokenizer(path, 384)
    return path


def make_engine(path, **kwargs):
    kwargs = {"num_kv_blocks": 16, "max_num_seqs": 2, "block_size": BLOCK,
              "max_prefill_tokens": 16, **kwargs}
    return LLMEngine.from_args(EngineArgs(model=str(path), backend="numpy", **kwargs))


def prompt(seed, n):
    return np.random.default_rng(seed).integers(0, 384, n).tolist()


def run(engine, p, rid="r"):
    return run_one(engine, p, GREEDY, rid)


assert_same = assert_same_output


def first_run(engine):
    """Run the long prompt; its result and its prefix blocks' hashes (the prefix-cache keys)."""
    engine.add_request("first", prompt(1, LENGTH), GREEDY)
    engine.step()
    hashes = list(engine.scheduler.running[0].block_hashes[:CACHED // BLOCK])
    return run_to_completion(engine)["first"], hashes


def close_kv_tiers(engine):
    """Write the blocks still on the device to the tiers and stop the disk tier (as shutdown)."""
    engine.block_manager.flush_to_tiers()
    engine.kv_tiers.close()


def assert_all_freed(engine):
    bm = engine.block_manager
    assert bm.num_used_blocks == 0 and bm.window_pool.num_used_blocks == 0


def evict_then_rerun(engine):
    """Run the long prompt, push its blocks out of both device pools, run it again."""
    first, hashes = first_run(engine)
    run(engine, prompt(2, 54), "other1")
    run(engine, prompt(3, 54), "other2")
    bm = engine.block_manager
    assert not any(h in bm.block_of or h in bm.window_pool.block_of for h in hashes)
    return first, run(engine, prompt(1, LENGTH), "again")


@pytest.fixture(scope="module")
def cold(checkpoint):
    return run(make_engine(checkpoint, enable_prefix_caching=False), prompt(1, LENGTH))


def test_tiers_keep_the_window_pool(checkpoint):
    engine = make_engine(checkpoint, kv_host_gb=0.01)
    assert engine.kv_config.window_pool.window == WINDOW
    tiers = engine.kv_tiers
    assert engine.block_manager.window_pool.tiers is tiers.window
    # the main tiers' records hold the two full-attention layers, the window tiers' the two
    # sliding ones (K and V each, float32)
    assert tiers.io.block_bytes == 2 * (2 * 1 * 32 * 4) * BLOCK
    assert tiers.window.io.block_bytes == 2 * (2 * 2 * 16 * 4) * BLOCK


def test_host_tiers_restore_both_pools(checkpoint, cold):
    engine = make_engine(checkpoint, kv_host_gb=0.01)
    first, again = evict_then_rerun(engine)
    assert first.num_cached_tokens == 0 and again.num_cached_tokens == CACHED
    tiers = engine.stats().kv_tiers
    assert tiers["host"]["hits"] == CACHED // BLOCK
    assert tiers["window_host"]["hits"] == NUM_WINDOW_BLOCKS
    assert_same(cold, first)
    assert_same(cold, again)
    assert_all_freed(engine)


def test_disk_tiers_restore_both_pools_and_survive_restart(checkpoint, cold, tmp_path):
    engine = make_engine(checkpoint, kv_offload_dir=str(tmp_path), kv_disk_restore="always")
    _, again = evict_then_rerun(engine)
    tiers = engine.stats().kv_tiers
    assert again.num_cached_tokens == CACHED
    assert tiers["disk"]["hits"] >= 1 and tiers["window_disk"]["hits"] >= 1
    assert_same(cold, again)
    assert_all_freed(engine)
    close_kv_tiers(engine)
    restarted = make_engine(checkpoint, kv_offload_dir=str(tmp_path), kv_disk_restore="always")
    out = run(restarted, prompt(1, LENGTH))
    tiers = restarted.stats().kv_tiers
    assert out.num_cached_tokens == CACHED
    assert tiers["disk"]["hits"] == CACHED // BLOCK
    assert tiers["window_disk"]["hits"] == NUM_WINDOW_BLOCKS
    assert_same(cold, out)
    assert_all_freed(restarted)
    close_kv_tiers(restarted)
    names = sorted(p.name for p in tmp_path.glob("kv-*.json"))
    assert len(names) == 2 and names[0] == names[1].replace(".json", "-window.json")


def test_a_prefix_whose_window_blocks_are_gone_everywhere_is_recomputed(checkpoint, cold):
    engine = make_engine(checkpoint, kv_host_gb=0.01)
    _, hashes = first_run(engine)
    run(engine, prompt(2, 54), "other1")
    run(engine, prompt(3, 54), "other2")
    window = engine.kv_tiers.window
    window.arena.give(window.host.pop(hashes[-1]))
    again = run(engine, prompt(1, LENGTH), "again")
    assert again.num_cached_tokens == CACHED - BLOCK
    assert_same(cold, again)
    assert_all_freed(engine)
