"""Async scheduling on CUDA: ``to_host_async`` reads what was queued before it, ``copy_many``
(a step's inputs in one transfer), and tiny Qwen3 / Qwen3.5 engines give the same tokens with the
overlap on and off (also stepped on a thread)."""

import threading

import numpy as np
import pytest

from cuda_probe import HAS_GPU

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HAS_GPU, reason="no CUDA device")]


def test_to_host_async_sees_the_queued_value(cuda_backend):
    be = cuda_backend
    a = be.from_host(np.arange(64, dtype=np.int32))
    read = be.to_host_async(a)
    be.copy_from_host(a, np.full(64, 7, np.int32))  # queued after the read
    np.testing.assert_array_equal(read.wait(), np.arange(64))
    np.testing.assert_array_equal(be.to_host(a), np.full(64, 7))


@pytest.mark.parametrize("big", [False, True])
def test_copy_many_batches_host_and_device_sources(cuda_backend, big):
    """One transfer + one copy kernel (or, past the staging slot, one copy at a time): mixed
    dtypes, odd sizes, slices at odd offsets, an empty pair and device sources."""
    be = cuda_backend
    rng = np.random.default_rng(3)
    n = 70_000 if big else 13
    dsts = [be.zeros((n,), np.int32), be.zeros((n,), np.float32), be.zeros((5,), np.int64),
            be.zeros((7,), np.uint8), be.zeros((0,), np.int32), be.zeros((9, 3), np.int32)]
    hosts = [rng.integers(-9, 9, n).astype(np.int32), rng.standard_normal(n).astype(np.float32),
             np.arange(5, dtype=np.int64) << 40, np.arange(7, dtype=np.uint8),
             np.zeros(0, np.int32), rng.integers(0, 99, (9, 3)).astype(np.int32)]
    src = be.from_host(np.arange(11, dtype=np.int32))
    out = be.zeros((16,), np.int32)
    be.copy_many(list(zip(dsts, hosts)), [(out[3:9], src[5:11]), (out[10:11], src[0:1])])
    for d, h in zip(dsts, hosts):
        np.testing.assert_array_equal(be.to_host(d), h)
    want = np.zeros(16, np.int32)
    want[3:9], want[10] = np.arange(5, 11), 0
    np.testing.assert_array_equal(be.to_host(out), want)
    with pytest.raises(ValueError, match="copy_many"):
        be.copy_many([(dsts[2], np.zeros(4, np.int64)), (dsts[3], hosts[3])])


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    from atlas_core.api import Registry
    from atlas_core.testing.checkpoints import write_tiny_checkpoint

    registry = Registry()
    archs = ["Qwen3ForCausalLM"]
    if "Qwen3_5ForCausalLM" in registry.names("weight_loaders"):
        archs.append("Qwen3_5ForCausalLM")
    root = tmp_path_factory.mktemp("async")
    return {a: write_tiny_checkpoint(a, root / a, dtype="float32", registry=registry)
            for a in archs}


def _run(path, flag, threaded=False):
    from atlas_core.api import EngineArgs, LLMEngine, SamplingParams
    from atlas_core.testing.fake_model import run_to_completion

    engine = LLMEngine.from_args(EngineArgs(model=str(path), backend="cuda", num_kv_blocks=64,
                                            max_num_seqs=4, block_size=8,
                                            async_scheduling=flag))
    rng = np.random.default_rng(1)
    params = [SamplingParams(temperature=0, max_tokens=12, ignore_eos=True),
              SamplingParams(temperature=1.0, seed=4, max_tokens=9, ignore_eos=True, n=2),
              SamplingParams(temperature=0.7, seed=5, max_tokens=15, ignore_eos=True)]
    for i, p in enumerate(params):
        engine.add_request(f"r{i}", rng.integers(0, 370, 4 + 9 * i).tolist(), p)
    box = {}
    if threaded:
        t = threading.Thread(target=lambda: box.update(out=run_to_completion(engine)))
        t.start()
        t.join()
    else:
        box["out"] = run_to_completion(engine)
    assert engine.block_manager.num_used_blocks == 0
    chained = engine.runner.num_chained_steps
    return {k: [c.token_ids for c in v.outputs] for k, v in box["out"].items()}, chained


@pytest.mark.parametrize("arch", ["Qwen3ForCausalLM", "Qwen3_5ForCausalLM"])
def test_engine_tokens_same_with_overlap(paths, arch):
    if arch not in paths:
        pytest.skip("atlas-qwen35 is not installed")
    want, none = _run(paths[arch], False)
    got, chained = _run(paths[arch], True)
    assert none == 0 and chained > 0
    assert got == want
    threaded, _ = _run(paths[arch], True, threaded=True)
    assert threaded == want


@pytest.mark.parametrize("arch", ["Qwen3ForCausalLM", "Qwen3_5ForCausalLM"])
def test_engine_tokens_same_with_layer_scope(paths, arch, monkeypatch):
    """Every step (prefills and the captured decode graphs) reusing each layer's workspace."""
    if arch not in paths:
        pytest.skip("atlas-qwen35 is not installed")
    import atlas_cuda.backend
    want, _ = _run(paths[arch], False)
    monkeypatch.setattr(atlas_cuda.backend, "LAYER_SCOPE_BYTES", 0)
    got, _ = _run(paths[arch], False)
    assert got == want
