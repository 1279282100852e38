"""Disk tier hits read back or recomputed (--kv-disk-restore): with a disk slower than prefill
the engine recomputes (same outputs, no cached tokens, counted as skipped), with a fast disk it
reads; ``always`` / ``never`` force either; the rates are measured."""

import numpy as np
import pytest

from atlas_core.engine import EngineArgs, LLMEngine, SamplingParams
from atlas_core.engine.kv_restore import DiskRestorePolicy, RateEstimate
from atlas_core.engine.kv_tiers import close_kv_tiers
from atlas_core.server.metrics import _kv_tier_metrics
from atlas_core.testing.checkpoints import write_tiny_checkpoint
from atlas_core.testing.fake_model import run_to_completion

pytestmark = pytest.mark.timeout(120)

GREEDY = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
PROMPT = np.random.default_rng(1).integers(0, 370, 70).tolist()


class FixedRate:
    """A rate estimate that ignores observations."""

    def __init__(self, rate):
        self.rate = rate

    def observe(self, amount, seconds):
        pass


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_tiny_checkpoint("Qwen3ForCausalLM", tmp_path_factory.mktemp("qwen3"))


@pytest.fixture(scope="module")
def offload_dir(model_dir, tmp_path_factory):
    """A disk tier holding PROMPT's 4 full blocks, and the tokens a cold run generates."""
    root = tmp_path_factory.mktemp("kv")
    engine = make_engine(model_dir, root)
    tokens = run(engine, PROMPT).outputs[0].token_ids
    close_kv_tiers(engine)
    return root, tokens


def make_engine(model_dir, root, **kwargs):
    return LLMEngine.from_args(EngineArgs(model=str(model_dir), backend="numpy", max_num_seqs=2,
                                          num_kv_blocks=12, kv_offload_dir=str(root), **kwargs))


def run(engine, p):
    engine.add_request("r", p, GREEDY)
    return run_to_completion(engine)["r"]


def restarted(model_dir, offload_dir, disk_rate, prefill_rate, mode="auto"):
    """A fresh engine over ``offload_dir`` with fixed disk (bytes/s) and prefill (tokens/s)
    rates; returns it, PROMPT's output and its disk-tier stats."""
    engine = make_engine(model_dir, offload_dir[0], kv_disk_restore=mode)
    engine.kv_tiers.disk.read_rate = FixedRate(disk_rate)
    engine.kv_tiers.restore.prefill_rate = FixedRate(prefill_rate)
    out = run(engine, PROMPT)
    assert out.outputs[0].token_ids == offload_dir[1]
    return engine, out, engine.stats().kv_tiers["disk"]


def test_slow_disk_is_recomputed_and_counted(model_dir, offload_dir):
    engine, out, disk = restarted(model_dir, offload_dir, disk_rate=1.0, prefill_rate=1e6)
    assert out.num_cached_tokens == 0
    assert disk["skipped_blocks"] == 4 and disk["hits"] == 0 and disk["misses"] == 0
    _, read_s, recompute_s, read = engine.kv_tiers.restore.last_choice
    assert not read and read_s > recompute_s
    tiers = engine.kv_tiers
    while tiers.disk.reads:
        tiers.wait_reads()
    assert tiers.disk.bytes_read == 4 * tiers.disk.record_size  # the background probe
    close_kv_tiers(engine)


def test_fast_disk_is_read(model_dir, offload_dir):
    engine, out, disk = restarted(model_dir, offload_dir, disk_rate=1e12, prefill_rate=1.0)
    assert out.num_cached_tokens == 64
    assert disk["hits"] == 4 and disk["skipped_blocks"] == 0
    close_kv_tiers(engine)


def test_always_reads_a_slow_disk(model_dir, offload_dir):
    engine, out, disk = restarted(model_dir, offload_dir, 1.0, 1e6, mode="always")
    assert out.num_cached_tokens == 64 and disk["hits"] == 4 and disk["skipped_blocks"] == 0
    close_kv_tiers(engine)


def test_never_recomputes_a_fast_disk_without_reading(model_dir, offload_dir):
    engine, out, disk = restarted(model_dir, offload_dir, 1e12, 1.0, mode="never")
    assert out.num_cached_tokens == 0 and disk["skipped_blocks"] == 4
    assert engine.kv_tiers.disk.bytes_read == 0 and not engine.kv_tiers.disk.reads
    close_kv_tiers(engine)


def test_rates_are_measured(model_dir, offload_dir):
    engine = make_engine(model_dir, offload_dir[0])
    assert engine.kv_tiers.restore.prefill_rate.rate is None
    out = run(engine, PROMPT)  # nothing timed yet: the disk is read
    assert out.num_cached_tokens == 64
    disk = engine.stats().kv_tiers["disk"]
    assert disk["read_bytes_per_s"] > 0 and engine.kv_tiers.restore.prefill_rate.rate > 0
    close_kv_tiers(engine)


def test_rate_estimate_and_policy():
    rate = RateEstimate(decay=0.5)
    assert rate.rate is None
    rate.observe(100, 1.0)
    rate.observe(300, 1.0)
    assert rate.rate == pytest.approx((50 + 300) / 1.5)
    policy = DiskRestorePolicy("auto", block_size=16)
    assert policy.should_read(10, 1 << 20, disk_rate=None)  # no prefill timed yet
    policy.prefill_rate.observe(16_000, 1.0)  # 0.01 s per block
    assert policy.estimate(10, 1 << 20, 1e9) == pytest.approx((0.0105, 0.01), rel=0.01)
    assert not policy.should_read(10, 1 << 20, 1e9)
    assert policy.should_read(10, 1 << 20, 2e9)
    with pytest.raises(ValueError, match="--kv-disk-restore"):
        DiskRestorePolicy("sometimes", 16)
    with pytest.raises(ValueError, match="kv_disk_restore"):
        EngineArgs(model="m", kv_disk_restore="sometimes")


def test_skipped_blocks_and_read_rate_on_metrics():
    families = {f.name: f for f in _kv_tier_metrics(
        {"disk": {"hits": 1, "misses": 0, "skipped_blocks": 7, "read_bytes_per_s": 2e9,
                  "used_bytes": 0, "capacity_bytes": 1}})}
    [sample] = [s for s in families["atlas_kv_tier_skipped_blocks"].samples
                if s.name.endswith("_total")]
    assert sample.labels == {"tier": "disk"} and sample.value == 7
    assert families["atlas_kv_tier_read_bytes_per_second"].samples[0].value == 2e9
