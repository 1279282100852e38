"""`atlas bench` over batch x context cells (decode timed AT the context), the bytes a step
reads, skipped cells, CSV; the decode-step timer, the start-up floor line and its metrics."""

import csv
import dataclasses
import io
import json
import re
from types import SimpleNamespace

import pytest

from atlas_core.bench import runner
from atlas_core.bench.floor import floor_line, known_bandwidth
from atlas_core.bench.random_model import build_random_model
from atlas_core.bench.report import CSV_FIELDS
from atlas_core.bench.shapes import shape_config, step_bytes
from atlas_core.cli import main
from atlas_core.engine import EngineArgs, LLMEngine, SamplingParams
from atlas_core.engine import step_timing
from atlas_core.engine.step_timing import DecodeStepTimer, StepBytes
from atlas_core.interfaces.gpu_backend import DeviceInfo
from atlas_core.plugins import Registry
from atlas_core.server.metrics import Metrics


def _engine(name="tiny", **kw):
    registry = Registry()
    backend = registry.create("gpu_backends", "numpy")
    model = build_random_model(shape_config(name), backend, registry, dtype="bfloat16")
    args = {"max_num_seqs": 4, "max_prefill_tokens": 256, "max_seq_len": 256,
            "enable_prefix_caching": False, **kw}
    return LLMEngine(model, backend, EngineArgs(**args))


@pytest.mark.parametrize("name", ["tiny", "tiny-moe", "tiny-qwen3.5-moe"])
def test_step_bytes_of_a_loaded_model_match_the_config_arithmetic(name):
    # The loaded model's count is the config's bf16 arithmetic plus the parameters it stores
    # wider (the hybrid's float32 gate constants and norms): bytes actually read.
    engine = _engine(name)
    count = StepBytes(engine.model, engine.kv_config)
    wider = sum(m.params[local].nbytes - m.params[local].size * 2
                for _, m, local, _ in engine.model.named_specs())
    assert wider == (176 if name == "tiny-qwen3.5-moe" else 0)
    config = shape_config(name)
    for batch, context in [(1, 0), (1, 100), (3, 100), (4, 7)]:
        assert count(batch, batch * context) == step_bytes(config, context, batch) + wider


def test_decode_is_timed_at_the_cells_context(monkeypatch):
    # atlas bench used to time decode after 128-token prompts whatever --prompt-len said.
    engine = _engine()
    calls = []
    real_run = runner._run

    def spy(engine, prompts, max_tokens, full_steps=None):
        calls.append((len(prompts), {len(p) for p in prompts}, full_steps))
        return real_run(engine, prompts, max_tokens, full_steps)

    decode_contexts = []
    real_complete = engine.decode_timer.on_complete

    def record(sched):
        if sched.is_decode_only:
            decode_contexts.append(min(s.start for s in sched.scheduled))
        real_complete(sched)

    monkeypatch.setattr(runner, "_run", spy)
    monkeypatch.setattr(engine.decode_timer, "on_complete", record)
    cells = runner.measure(engine, batches=[1, 2], contexts=[40, 160], decode_tokens=6,
                           bandwidth_gbs=10.0, log=lambda msg: None)
    assert [(c["batch"], c["context"], c["status"]) for c in cells] == [
        (1, 40, "ok"), (2, 40, "ok"), (1, 160, "ok"), (2, 160, "ok")]
    assert (2, {160}, 6) in calls and (1, {40}, 6) in calls
    assert max(decode_contexts) >= 160
    by_cell = {(c["batch"], c["context"]): c for c in cells}
    assert by_cell[2, 160]["step_gb"] > by_cell[2, 40]["step_gb"] > by_cell[1, 40]["step_gb"]
    for c in cells:
        assert c["ttft_s"] > 0 and c["tok_s"] > 0 and c["prefill_tok_s"] > 0
        assert c["floor_ms"] == pytest.approx(c["step_gb"] / 10.0 * 1e3)
        assert c["pct_floor"] == pytest.approx(100 * c["floor_ms"] / c["step_ms"])


def test_decode_is_timed_only_while_the_whole_batch_decodes():
    # A 64 x 8,192 cell on the H200 printed 116.9% "of floor": the first sequences had finished
    # their decode tokens before the last ones left prefill, so the timed steps ran half the
    # batch. Now the first ones keep decoding until the last starts, and only steps that decode
    # every sequence count.
    engine = _engine(max_prefill_tokens=64)
    cell, = runner.measure(engine, batches=[4], contexts=[96], decode_tokens=5,
                           bandwidth_gbs=10.0, log=lambda msg: None)
    assert cell["status"] == "ok"
    assert cell["tok_s"] * cell["step_ms"] / 1e3 == pytest.approx(4, rel=1e-6)
    assert not engine.has_unfinished_requests()
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_cells_that_cannot_fit_are_skipped_not_run():
    engine = _engine(num_kv_blocks=10, max_seq_len=150)
    cells = runner.measure(engine, batches=[1, 2], contexts=[100, 4000], decode_tokens=6,
                           bandwidth_gbs=10.0, log=lambda msg: None)
    status = {(c["batch"], c["context"]): c["status"] for c in cells}
    assert status[1, 100] == "ok"
    assert status[2, 100].startswith("skipped: needs ") and "GiB of KV cache" in status[2, 100]
    assert "max_position_embeddings 2048" in status[1, 4000]


def test_a_cell_whose_step_fails_says_failed_and_why(monkeypatch, capsys):
    # gemma-4 on the H200 ran out of device memory in every step; the cells said "skipped: 0
    # decode steps of the whole batch timed; raise --decode-tokens" and the bench exited 0.
    engine = _engine()
    real_execute = engine.runner.execute

    def execute(sched, rows_of):
        if any(s.seq.num_prompt_tokens >= 100 for s in sched.scheduled):
            raise RuntimeError("CUDA driver error CUDA_ERROR_OUT_OF_MEMORY")
        return real_execute(sched, rows_of)

    monkeypatch.setattr(engine.runner, "execute", execute)
    logs = []
    cells = runner.measure(engine, batches=[1], contexts=[40, 120], decode_tokens=5,
                           bandwidth_gbs=10.0, log=logs.append)
    status = {c["context"]: c["status"] for c in cells}
    assert status[40] == "ok"
    assert status[120].startswith("failed: ") and "OUT_OF_MEMORY" in status[120]
    assert any("warm-up of batch 1 at context 120 failed" in m for m in logs)
    assert not engine.has_unfinished_requests()
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_the_report_says_what_ran_the_matmuls():
    from atlas_core.bench.report import to_text
    from atlas_core.bench.runner import BenchResult
    result = BenchResult("m", "cuda", "GPU", matmul="the own mma.sync GEMM: nvmath-python "
                         "(cuBLASLt) is not installed")
    assert "matmuls of more than one row: the own mma.sync GEMM" in to_text(result)
    assert "matmuls of more than one row" not in to_text(BenchResult("m", "numpy", "CPU"))


def test_bench_cli_exits_1_when_a_cell_failed(monkeypatch, capsys):
    def measure(engine, **kw):
        return [{"batch": 1, "context": 16, "status": "failed: out of memory"}]

    monkeypatch.setattr(runner, "measure", measure)
    assert main(["bench", "--model", "tiny", "--backend", "numpy", "--batch", "1",
                 "--context", "16", "--decode-tokens", "4", "--bandwidth", "50"]) == 1
    out = capsys.readouterr().out
    assert "failed: out of memory" in out and "1 of 1 cells failed" in out


def test_bench_cli_matrix_csv_and_json(tmp_path, capsys):
    out_json, out_csv = tmp_path / "b.json", tmp_path / "b.csv"
    assert main(["bench", "--model", "tiny", "--backend", "numpy", "--batch", "2,1",
                 "--context", "16,48", "--decode-tokens", "4", "--copy-mb", "1",
                 "--bandwidth", "50", "--json", str(out_json), "--csv", str(out_csv)]) == 0
    result = json.loads(out_json.read_text())
    assert result["bandwidth_gbs"] == 50 and result["bandwidth_source"] == "--bandwidth"
    rows = list(csv.DictReader(io.StringIO(out_csv.read_text())))
    assert tuple(rows[0]) == CSV_FIELDS
    assert [(r["engine"], r["batch"], r["context"], r["status"]) for r in rows] == [
        ("atlas", "1", "16", "ok"), ("atlas", "2", "16", "ok"), ("atlas", "1", "48", "ok"),
        ("atlas", "2", "48", "ok")]
    text = capsys.readouterr().out
    assert "% floor" in text and "prefill tok/s" in text


@pytest.mark.parametrize("argv, message", [
    (["--batch", "0,2"], "comma-separated list of positive integers"),
    (["--context", "abc"], "comma-separated list of positive integers"),
    (["--baseline", "vllm"], "unknown baseline vllm"),
])
def test_bad_bench_flags_say_what_to_do(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["bench", *argv])
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_too_few_decode_tokens_is_a_clear_error(capsys):
    assert main(["bench", "--backend", "numpy", "--decode-tokens", "2"]) == 2
    assert "use 4 or more" in capsys.readouterr().err


def test_decode_step_timer_times_consecutive_decode_steps(monkeypatch):
    engine = _engine()
    timer = DecodeStepTimer(engine.model, engine.kv_config)
    clock = iter([0.0, 0.004, 0.010, 0.020, 0.0245])
    monkeypatch.setattr(step_timing.time, "perf_counter", lambda: next(clock))

    def sched(decode, start=99):
        return SimpleNamespace(is_decode_only=decode,
                               scheduled=[SimpleNamespace(start=start, num_tokens=1)])

    for decode in (True, True, False, True, True):
        timer.on_complete(sched(decode))
    snap = timer.snapshot()
    assert snap.count == 2 and snap.total_seconds == pytest.approx(0.0085)
    assert dict(snap.buckets)[0.004] == 1 and dict(snap.buckets)[0.005] == 2
    assert snap.floor_fraction is None
    timer.bandwidth_gbs = 1.0
    per_step = timer.step_bytes(1, 100)
    assert timer.snapshot().floor_fraction == pytest.approx(2 * per_step / 1e9 / 0.0085)


def test_floor_line_on_cpu_and_on_a_known_gpu():
    engine = _engine()
    assert floor_line(engine) == "decode floor: n/a on the CPU backend"
    assert engine.decode_timer.bandwidth_gbs is None
    fake = SimpleNamespace(device_info=lambda: DeviceInfo("NVIDIA H200", "cuda", 141 << 30))
    line = floor_line(SimpleNamespace(decode_timer=engine.decode_timer, backend=fake))
    per_step = engine.decode_timer.step_bytes(1, 1024)
    assert known_bandwidth("NVIDIA H200") == 4250.0
    assert engine.decode_timer.bandwidth_gbs == 4250.0
    assert f"{4250e9 / per_step:,.0f} tok/s at batch 1" in line


def test_floor_line_of_a_parallel_front_probes_rank_0():
    """A -tp run's front backend has no device of its own: the floor's bandwidth comes from
    the copy probe its workers run on rank 0 (FrontBackend.probe_bandwidth), or says why not."""
    from atlas_core.parallel.front import FrontBackend
    engine = _engine()
    device = DeviceInfo("NVIDIA Future GPU", "cuda", 80 << 30)
    front = FrontBackend("cuda", 2, device, True, lambda n: (2000.0, "measured copy"))
    line = floor_line(SimpleNamespace(decode_timer=engine.decode_timer, backend=front))
    assert engine.decode_timer.bandwidth_gbs == 2000.0
    assert "rank 0's NVIDIA Future GPU, measured copy" in line
    failed = FrontBackend("cuda", 2, device, True, lambda n: (None, "the copy probe failed"))
    line = floor_line(SimpleNamespace(decode_timer=engine.decode_timer, backend=failed))
    assert line == "decode floor: n/a (the copy probe failed)"


def test_metrics_expose_decode_step_time_and_floor_fraction():
    engine = _engine()
    engine.decode_timer.bandwidth_gbs = 10.0
    for i in range(2):
        engine.add_request(f"r{i}", [1, 2, 3, 4], SamplingParams(max_tokens=6, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()
    stats = engine.stats()
    assert stats.decode_steps.count >= 3
    # AsyncLLMEngine.stats() is dataclasses.replace of this: the timings must survive it.
    stats = dataclasses.replace(stats, is_alive=True)
    text = Metrics(lambda: stats).render().decode()
    assert f"atlas_decode_step_seconds_count {float(stats.decode_steps.count)}" in text
    assert 'atlas_decode_step_seconds_bucket{le="+Inf"}' in text
    fraction = [line for line in text.splitlines()
                if line.startswith("atlas_decode_floor_fraction ")]
    assert fraction and 0 < float(fraction[0].split()[1]) < 1


def test_a_baseline_that_times_out_keeps_the_cells_it_finished(monkeypatch, capsys):
    import sys

    from atlas_core.bench import baseline
    done = json.dumps({"cell": {"batch": 1, "context": 64, "tok_s": 100.0}})
    child = ("import sys, time; print('[compiled baseline] batch 2 at context 64', "
             f"file=sys.stderr, flush=True); print({done!r}, flush=True); time.sleep(60)")
    seen = []

    def command(module, spec):
        seen.append(module)
        return [sys.executable, "-c", child]

    monkeypatch.setattr(baseline, "_command", command)
    result = baseline.run_isolated({}, 3, "atlas_core.bench.torch_baseline",
                                   "compiled-PyTorch baseline")
    assert seen == ["atlas_core.bench.torch_baseline"]
    assert result["cells"] == [{"batch": 1, "context": 64, "tok_s": 100.0}]
    assert result["error"] == ("compiled-PyTorch baseline did not finish in 3 s (1 cells done; "
                               "raise --baseline-timeout)")
    # the child's progress reached our stderr as it happened, labelled
    assert ("[compiled-PyTorch baseline] [compiled baseline] batch 2 at context 64"
            in capsys.readouterr().err)


def test_a_failing_baseline_reports_its_last_stderr_line(monkeypatch):
    import sys

    from atlas_core.bench import baseline
    child = "import sys; print('first', file=sys.stderr); sys.exit('CUDA out of memory')"
    monkeypatch.setattr(baseline, "_command", lambda module, spec: [sys.executable, "-c", child])
    result = baseline.run_isolated({}, 30, label="HF baseline")
    assert result == {"error": "HF baseline failed (exit 1): CUDA out of memory", "cells": []}


def test_read_result_takes_the_final_line_over_partial_cells():
    from atlas_core.bench.baseline import read_result
    final = {"library": "x", "cells": [{"batch": 1}]}
    out = "\n".join(["noise", json.dumps({"cell": {"batch": 1}}), json.dumps(final)])
    assert read_result(out) == (final, [{"batch": 1}])


def test_serve_states_the_floor_and_metrics_time_decode_steps(tmp_path):
    import signal
    import subprocess
    import sys

    import httpx

    from atlas_core.testing.checkpoints import write_tiny_checkpoint
    from test_server_support import wait_until
    write_tiny_checkpoint("Qwen3ForCausalLM", tmp_path)
    cmd = [sys.executable, "-c", "import sys; from atlas_core.cli import main; sys.exit(main())",
           "serve", str(tmp_path), "--backend", "numpy", "--port", "0", "--num-kv-blocks", "32",
           "--served-model-name", "tiny"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        url = re.search(r"(http://\S+)/v1", proc.stdout.readline()).group(1)
        assert wait_until(lambda: httpx.get(f"{url}/health").status_code == 200, timeout=60)
        lines = [proc.stdout.readline()]
        while not lines[-1].startswith("decode floor") and len(lines) < 10:
            lines.append(proc.stdout.readline())
        assert lines[-1] == "decode floor: n/a on the CPU backend\n", lines
        body = {"model": "tiny", "max_tokens": 8, "prompt": "hi"}
        assert httpx.post(f"{url}/v1/completions", json=body).status_code == 200
        text = httpx.get(f"{url}/metrics").text
        count = re.search(r"^atlas_decode_step_seconds_count (\S+)$", text, re.M)
        assert count and float(count.group(1)) >= 5
        assert "atlas_decode_floor_fraction" not in text  # no bandwidth on the CPU backend
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) in (0, 130)
        proc.stdout.close()


def test_bench_sizes_the_engine_for_the_tokens_decoded_while_a_batch_prefills(tmp_path):
    # The H200's nemotron batch-32 cell was skipped as "needs 1.69 GiB of KV cache, 67 GiB
    # fit": max_seq_len had no room for the first sequences' tokens during the batch's prefill.
    out = tmp_path / "b.json"
    assert main(["bench", "--model", "tiny", "--backend", "numpy", "--batch", "4",
                 "--context", "64", "--decode-tokens", "4", "--max-prefill-tokens", "16",
                 "--copy-mb", "1", "--bandwidth", "50", "--json", str(out)]) == 0
    cell, = json.loads(out.read_text())["cells"]
    assert cell["status"] == "ok"
