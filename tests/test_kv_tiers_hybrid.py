"""KV tiers on a hybrid model (tiny Qwen3.5-MoE, numpy backend): recurrent-state snapshots evicted
from their device rows spill with the KV blocks and come back from host memory and from disk
(after a restart too) with outputs identical to a cold run."""

import numpy as np
import pytest

from atlas_core.engine import EngineArgs, LLMEngine, SamplingParams
from atlas_core.engine.kv_tiers import close_kv_tiers
from atlas_core.plugins import Registry
from atlas_core.testing.checkpoints import write_tiny_checkpoint
from atlas_core.testing.fake_model import assert_same_output, run_one

pytestmark = pytest.mark.timeout(120)

ARCH = "Qwen3_5MoeForCausalLM"
GREEDY = SamplingParams(temperature=0, max_tokens=3, logprobs=3, ignore_eos=True)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    if ARCH not in Registry().names("weight_loaders"):
        pytest.skip("atlas-qwen35 is not installed")
    return write_tiny_checkpoint(ARCH, tmp_path_factory.mktemp("qwen35"))


def make_engine(model_dir, **kwargs):
    kwargs = {"num_kv_blocks": 16, "max_num_seqs": 2, "block_size": 8, "num_state_snapshots": 1,
              **kwargs}
    return LLMEngine.from_args(EngineArgs(model=str(model_dir), backend="numpy", **kwargs))


def prompt(seed, n):
    return np.random.default_rng(seed).integers(0, 370, n).tolist()


def run(engine, p, rid="r"):
    return run_one(engine, p, GREEDY, rid)


assert_same = assert_same_output


def evict_then_rerun(engine):
    first = run(engine, prompt(1, 37), "first")
    run(engine, prompt(2, 60), "other1")      # takes the one snapshot row and most KV blocks
    run(engine, prompt(3, 60), "other2")
    return first, run(engine, prompt(1, 37), "again")


@pytest.fixture(scope="module")
def cold(model_dir):
    return run(make_engine(model_dir, enable_prefix_caching=False), prompt(1, 37))


def test_without_tiers_the_snapshot_is_lost(model_dir):
    _, again = evict_then_rerun(make_engine(model_dir))
    assert again.num_cached_tokens == 0


def test_host_tier_restores_blocks_and_snapshot(model_dir, cold):
    engine = make_engine(model_dir, kv_host_gb=0.01)
    first, again = evict_then_rerun(engine)
    assert again.num_cached_tokens == 32
    tiers = engine.stats().kv_tiers
    assert tiers["state_host"]["hits"] >= 1 and tiers["host"]["hits"] >= 1
    assert_same(cold, first)
    assert_same(cold, again)


def test_disk_tier_restores_snapshot_after_restart(model_dir, cold, tmp_path):
    engine = make_engine(model_dir, kv_offload_dir=str(tmp_path))
    _, again = evict_then_rerun(engine)
    assert again.num_cached_tokens == 32
    assert_same(cold, again)
    close_kv_tiers(engine)
    restarted = make_engine(model_dir, kv_offload_dir=str(tmp_path))
    out = run(restarted, prompt(1, 37))
    close_kv_tiers(restarted)
    tiers = restarted.stats().kv_tiers
    assert out.num_cached_tokens == 32
    assert tiers["state_disk"]["hits"] == 1 and tiers["disk"]["hits"] == 4
    assert_same(cold, out)
