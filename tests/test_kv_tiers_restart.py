"""The disk tier across process lifetimes: a real `atlas serve` restarted over the same
--kv-offload-dir reports cached prompt tokens and the tier's metrics; a writer killed with
SIGKILL mid-write leaves nothing that a restarted engine would serve wrongly."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import httpx
import numpy as np
import pytest

from test_server_support import wait_until

from atlas_core.engine import EngineArgs, LLMEngine, SamplingParams
from atlas_core.engine.block_manager import block_hash
from atlas_core.engine.kv_tiers import close_kv_tiers
from atlas_core.testing.checkpoints import write_tiny_checkpoint
from atlas_core.testing.fake_model import run_to_completion

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_tiny_checkpoint("Qwen3ForCausalLM", tmp_path_factory.mktemp("qwen3"))


def start_server(model_dir, offload_dir):
    cmd = [sys.executable, "-c", "import sys; from atlas_core.cli import main; sys.exit(main())",
           "serve", str(model_dir), "--backend", "numpy", "--port", "0", "--num-kv-blocks", "24",
           "--max-num-seqs", "2", "--served-model-name", "tiny", "--kv-offload-dir",
           str(offload_dir), "--no-access-log"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = re.search(r"(http://\S+)/v1", proc.stdout.readline()).group(1)
        assert wait_until(lambda: httpx.get(f"{url}/health").status_code == 200, timeout=90)
    except BaseException:
        proc.kill()
        proc.communicate()
        raise
    return proc, url


def stop_server(proc) -> str:
    proc.send_signal(signal.SIGINT)
    try:
        out, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    return out


def complete(url, tokens):
    r = httpx.post(f"{url}/v1/completions", json={
        "model": "tiny", "prompt": tokens, "max_tokens": 4, "temperature": 0}, timeout=60)
    assert r.status_code == 200, r.text
    body = r.json()
    details = body["usage"].get("prompt_tokens_details") or {}
    return body["choices"][0]["text"], details.get("cached_tokens", 0)


def test_server_restart_serves_the_prompt_from_disk(model_dir, tmp_path):
    tokens = np.random.default_rng(7).integers(0, 370, 100).tolist()
    proc, url = start_server(model_dir, tmp_path)
    try:
        first, cached = complete(url, tokens)
        assert cached == 0
    finally:
        out = stop_server(proc)
    assert "KV tiers: host" in out and "disk" in out
    proc, url = start_server(model_dir, tmp_path)
    try:
        again, cached = complete(url, tokens)
        metrics = httpx.get(f"{url}/metrics").text
    finally:
        stop_server(proc)
    assert cached == 96 and again == first
    assert re.search(r'atlas_kv_tier_hits_total\{tier="disk"\} 6\.0', metrics)
    assert 'atlas_kv_tier_bytes_read_total{tier="disk"}' in metrics
    assert 'atlas_kv_tier_used_bytes{tier="disk"}' in metrics


WRITER = textwrap.dedent("""
    import sys
    import numpy as np
    from atlas_core.engine import EngineArgs, LLMEngine, SamplingParams
    from atlas_core.testing.fake_model import run_to_completion
    engine = LLMEngine.from_args(EngineArgs(model=sys.argv[1], backend="numpy", num_kv_blocks=12,
                                            max_num_seqs=2, kv_offload_dir=sys.argv[2]))
    params = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    for i in range(10_000):
        tokens = np.random.default_rng(i).integers(0, 370, 90).tolist()
        engine.add_request(str(i), tokens, params)
        run_to_completion(engine)
        print(i, flush=True)
""")


def test_kill_9_during_writes_then_restart(model_dir, tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(model_dir), str(tmp_path)],
                            stdout=subprocess.PIPE, text=True)
    try:
        while int(proc.stdout.readline().split()[0]) < 12:
            pass
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        proc.stdout.close()
    [space] = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert len([p for p in space.iterdir() if not p.name.startswith(".")]) >= 20
    prompts = {str(i): np.random.default_rng(i).integers(0, 370, 90).tolist() for i in range(8)}
    torn = space / block_hash(block_hash(None, prompts["0"][:16]), prompts["0"][16:32]).hex()
    torn.write_bytes(torn.read_bytes()[:-7])
    (space / f".{torn.name}.{_dead_pid()}.cafe.tmp").write_bytes(b"half a block")
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    restarted = LLMEngine.from_args(EngineArgs(model=str(model_dir), backend="numpy",
                                               num_kv_blocks=12, max_num_seqs=2,
                                               kv_offload_dir=str(tmp_path)))
    cold = LLMEngine.from_args(EngineArgs(model=str(model_dir), backend="numpy", num_kv_blocks=12,
                                          max_num_seqs=2, enable_prefix_caching=False))
    cached = 0
    for rid, tokens in prompts.items():
        for engine in (restarted, cold):
            engine.add_request(rid, tokens, params)
        warm, ref = run_to_completion(restarted)[rid], run_to_completion(cold)[rid]
        assert warm.outputs[0].token_ids == ref.outputs[0].token_ids
        cached += warm.num_cached_tokens
    close_kv_tiers(restarted)
    disk = restarted.stats().kv_tiers["disk"]
    assert cached > 0 and disk["hits"] > 0
    assert disk["corrupt"] >= 2
    assert not list(space.glob(".*.tmp"))


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    time.sleep(0.05)
    return proc.pid
