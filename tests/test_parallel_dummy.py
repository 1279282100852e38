"""``--load-format dummy``: models built from config.json alone with random weights, in one
process and split over two worker processes (numpy backend, ``cpu`` comm backend), and
``atlas bench -tp 2`` on a named shape (nothing written but a config.json) reporting per-rank
bytes and a floor. The outputs are meaningless; what is checked is that the runs work, that a
rank holds its shard only, and that the bench's floor counts one rank."""

import json
from types import SimpleNamespace

import numpy as np
import pytest

from atlas_core.bench.shapes import FP8_BLOCK, NVFP4
from atlas_core.engine import EngineArgs, LLMEngine
from atlas_core.testing.checkpoints import write_tiny_checkpoint
from atlas_core.testing.parallel import generate

PROMPTS = [[1, 2, 3, 4, 5], [7, 8, 9]]


def _config_only(architecture, path, **overrides):
    """A model directory holding config.json and the tokenizer files, no weights."""
    write_tiny_checkpoint(architecture, path, **overrides)
    for f in path.glob("*.safetensors*"):
        f.unlink()
    return path


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    return {"dense": _config_only("Qwen3ForCausalLM", tmp_path_factory.mktemp("dense")),
            "moe": _config_only("Qwen3MoeForCausalLM", tmp_path_factory.mktemp("moe"))}


def _engine(path, tp=1, ep=False):
    return LLMEngine.from_args(EngineArgs(
        model=str(path), backend="numpy", load_format="dummy", num_kv_blocks=48,
        max_num_seqs=4, tensor_parallel_size=tp, enable_expert_parallel=ep,
        distributed_timeout=60))


def _weight_bytes(step_bytes):
    """Parameter bytes a worker counted of its shard (dense + every expert stack)."""
    return step_bytes.dense + sum(nbytes for nbytes, _, _ in step_bytes.experts)


def _check_tokens(engine, max_tokens=5):
    out = generate(engine, PROMPTS, max_tokens=max_tokens)
    assert sorted(out) == ["r0", "r1"]
    assert all(len(tokens) == max_tokens for tokens, _ in out.values())
    vocab = engine.model.vocab_size
    assert all(0 <= t < vocab for tokens, _ in out.values() for t in tokens)


def test_one_process_needs_only_the_config(dirs):
    engine = _engine(dirs["dense"])
    assert engine.args.load_format == "dummy"
    _check_tokens(engine)


@pytest.mark.parametrize("kind,ep", [("dense", False), ("moe", True)])
def test_two_ranks_run_and_hold_their_shard_only(dirs, kind, ep):
    whole = _weight_bytes(_engine(dirs[kind]).decode_timer.step_bytes)
    engine = _engine(dirs[kind], tp=2, ep=ep)
    try:
        assert engine.backend.name == "numpy x2"
        _check_tokens(engine)
        ranks = engine.runner.step_bytes.ranks
        assert len(ranks) == 2
        for rank in ranks:
            # replicated norms (and the router) are the only parts every rank holds whole
            assert 0.45 * whole < _weight_bytes(rank) < 0.6 * whole
            if ep:
                assert rank.expert_share == 2
                assert all(n == 4 for _, n, _ in rank.experts)  # 8 experts, 4 a rank
        assert engine.decode_timer.step_bytes is engine.runner.step_bytes
    finally:
        engine.runner.shutdown()
    assert all(not p.is_alive() for p in engine.runner._procs)


@pytest.mark.parametrize("quant", [None, FP8_BLOCK, NVFP4])
def test_each_split_parameter_is_half_on_each_rank(dirs, quant):
    """In process, rank by rank (a stand-in comm: building and splitting talk to no peer):
    every parameter is whole (replicated) or half of the whole model's (split), the split ones
    are most of the elements, and a quantized config's projections stay quantized."""
    from atlas_core.backends.numpy_backend import NumpyBackend
    from atlas_core.bench.random_model import build_random_model
    from atlas_core.model.loader import architecture, create_loader, read_config
    from atlas_core.ops.quant import QuantizedWeight
    from atlas_core.parallel.transform import build_random_shard
    from atlas_core.plugins import Registry
    registry = Registry()
    config = read_config(dirs["moe"])
    if quant:
        config["quantization_config"] = dict(quant)

    def sizes(model):
        return {name: (int(np.prod(module.params[p].shape)),
                       isinstance(module.params[p], QuantizedWeight))
                for name, module, p, _ in model.named_specs()}
    whole = sizes(build_random_model(config, NumpyBackend(), registry))
    loader = create_loader(registry, architecture(config))
    for rank in range(2):
        shard = build_random_shard(loader, config, NumpyBackend(),
                                   SimpleNamespace(rank=rank, world_size=2), True)
        local = sizes(shard)
        assert set(local) == set(whole)
        assert all(local[n][1] == whole[n][1] for n in local)
        assert any(q for _, q in local.values()) == bool(quant)
        assert all(local[n][0] in (whole[n][0], whole[n][0] // 2) for n in local)
        split = [n for n in local if local[n][0] * 2 == whole[n][0]]
        assert sum(whole[n][0] for n in split) > 0.9 * sum(e for e, _ in whole.values())


def test_bench_tp_reports_per_rank_bytes_and_a_floor(tmp_path, monkeypatch, capsys):
    from atlas_core.cli import main
    monkeypatch.setenv("ATLAS_CACHE_DIR", str(tmp_path / "cache"))
    cell = ["--backend", "numpy", "--batch", "1", "--context", "16", "--decode-tokens", "6",
            "--copy-mb", "4"]
    assert main(["bench", "--model", "tiny", *cell, "--json", str(tmp_path / "one.json")]) == 0
    assert main(["bench", "--model", "tiny", "-tp", "2", *cell,
                 "--json", str(tmp_path / "two.json")]) == 0
    text = capsys.readouterr().out
    assert "PER RANK" in text and "rank 0's device, measured copy" in text
    # nothing but config.json was written
    written = [p.name for p in (tmp_path / "cache").rglob("*") if p.is_file()]
    assert written == ["config.json"]
    one, two = (json.loads((tmp_path / f).read_text()) for f in ("one.json", "two.json"))
    assert two["per_rank"] == 2 and one["per_rank"] == 0
    assert two["bandwidth_gbs"] > 0
    (c1,), (c2,) = one["cells"], two["cells"]
    assert c2["status"] == "ok" and c2["floor_ms"] > 0
    # a rank reads about half the weights (the norms are whole on both) and half the KV heads
    assert 0.45 * c1["step_gb"] < c2["step_gb"] < 0.65 * c1["step_gb"]
    assert np.isclose(c2["floor_ms"], 1e3 * c2["step_gb"] / two["bandwidth_gbs"])


def test_the_235b_shape_is_the_published_model_and_splits_over_four():
    from atlas_core.bench.shapes import shape_config, step_bytes
    from atlas_core.model.loader import architecture, create_loader
    from atlas_core.parallel.sharding import ShardPlan
    from atlas_core.parallel.transform import reshard_specs
    from atlas_core.plugins import Registry
    config = shape_config("qwen3-235b-a22b")
    loader = create_loader(Registry(), architecture(config))

    def params(model):
        return sum(int(np.prod(spec.shape)) for _, _, _, spec in model.named_specs())
    assert 235.0e9 < params(loader.build(config)) < 235.2e9  # 235B, 470 GB in bf16
    assert 43e9 < step_bytes(config, 1024) < 44e9  # 22B active (bf16) at batch 1
    for ep in (False, True):
        resolved = loader.resolve_config(config)
        plan = ShardPlan.from_config(resolved, 3, 4, ep)
        shard = loader.build(plan.local_config(resolved))
        reshard_specs(shard, plan)  # a rank's vocabulary rows and (EP) its experts
        assert 0.24 * 235.1e9 < params(shard) < 0.26 * 235.1e9


def test_serve_refuses_dummy_without_a_local_config(capsys):
    from atlas_core.cli import main
    assert main(["serve", "Qwen/Qwen3-235B-A22B", "--load-format", "dummy", "--port", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: --load-format dummy needs a local directory holding config")


@pytest.mark.parametrize("shape,ep", [("tiny", False), ("tiny-moe", True)])
def test_rank_model_decodes_alone(shape, ep):
    """bench/rank_model: one rank's shard runs whole engine steps in one process over the
    silent comm (what decode_timeline / decode_leave_one_out --tp time), its parameters the
    split sizes and its logits the whole vocabulary."""
    from atlas_core.backends.numpy_backend import NumpyBackend
    from atlas_core.bench.rank_model import SilentComm, build_rank_model
    from atlas_core.bench.shapes import shape_config
    from atlas_core.engine import EngineArgs, LLMEngine, SamplingParams
    from atlas_core.plugins import Registry
    be = NumpyBackend()
    config = shape_config(shape)
    model = build_rank_model(config, be, Registry(), tp=2, expert_parallel=ep, rank=1)
    engine = LLMEngine(model, be, EngineArgs(model=None, max_num_seqs=2, max_seq_len=64,
                                             num_kv_blocks=16, enable_prefix_caching=False))
    for i in range(2):
        engine.add_request(str(i), [1, 2, 3, 4 + i],
                           SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    done = []
    while engine.has_unfinished_requests():
        done += [o for o in engine.step() if o.finished]
    assert sorted(len(o.outputs[0].token_ids) for o in done) == [3, 3]
    assert all(0 <= t < config["vocab_size"] for o in done for t in o.outputs[0].token_ids)
    with pytest.raises(ValueError, match="outside a world of 2"):
        SilentComm(be, 2, rank=2)


def test_host_clock_times_phases_only_when_on(caplog):
    from atlas_core.parallel.host_clock import HostClock
    off = HostClock("off", on=False)
    with off("x"):
        pass
    assert not off.seconds
    on = HostClock("engine", on=True)
    for _ in range(3):
        with on("sending launch"):
            pass
    assert on.counts["sending launch"] == 3
    with caplog.at_level("WARNING"):
        on.report()
    assert "engine host time over" in caplog.text and "sending launch" in caplog.text


@pytest.mark.parametrize("quant", [None, FP8_BLOCK, NVFP4])
def test_random_weights_are_counted_and_refused_before_allocating(quant):
    """--load-format dummy: the bytes counted before materializing are the bytes allocated;
    a device too small is refused with both sizes (and, for a quantized config the backend
    would dequantize, how to keep it quantized) instead of running out of memory."""
    from atlas_core.backends.numpy_backend import NumpyBackend
    from atlas_core.bench.random_model import (build_random_model, check_random_fits,
                                               fill_random_params, random_weight_bytes)
    from atlas_core.bench.shapes import shape_config
    from atlas_core.interfaces import DeviceInfo
    from atlas_core.model.decoder_loader import model_dtype
    from atlas_core.model.loader import architecture, create_loader
    from atlas_core.model.weight_loading import WeightLoadError
    from atlas_core.plugins import Registry
    registry = Registry()
    config = dict(shape_config("tiny-moe"))
    if quant:
        config["quantization_config"] = dict(quant)
    be = NumpyBackend()
    dtype = model_dtype(config, None)
    loader = create_loader(registry, architecture(config))
    need, packed = random_weight_bytes(loader.build(config), config, be, dtype)
    model = build_random_model(config, be, registry)
    assert need == fill_random_params(model, be)
    assert packed == need  # the numpy backend keeps every quantized format
    be.device_info = lambda: DeviceInfo("a small device", "cpu", need - 1)
    with pytest.raises(WeightLoadError, match="--load-format dummy: this config's weights need"):
        check_random_fits(loader.build(config), config, be, dtype)
    if quant:  # the backend dequantizes; kept quantized it would fit
        be.quantized_weight_formats = frozenset()
        be.keep_quantized_hint = "set KEEP=1"
        plain, _ = random_weight_bytes(loader.build(config), config, be, dtype)
        be.device_info = lambda: DeviceInfo("a small device", "cpu", packed)
        with pytest.raises(WeightLoadError, match=r"projections are being dequantized .*set KEEP=1"):
            check_random_fits(loader.build(config), config, be, dtype)
        assert plain > packed
        # a backend that can keep them does, instead of refusing
        be.keep_quantized = lambda: setattr(be, "quantized_weight_formats",
                                            NumpyBackend.quantized_weight_formats) or True
        check_random_fits(loader.build(config), config, be, dtype)
        assert random_weight_bytes(loader.build(config), config, be, dtype)[0] == packed
