"""``atlas serve`` as users run it: startup errors are one line; a served model answers."""

from __future__ import annotations

import re
import signal
import subprocess
import sys

import httpx
import pytest

from atlas_core.testing.checkpoints import write_tiny_checkpoint
from test_server_support import wait_until

SERVE = [sys.executable, "-c", "import sys; from atlas_core.cli import main; sys.exit(main())",
         "serve"]


def run_serve(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([*SERVE, *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny")
    write_tiny_checkpoint("Qwen3ForCausalLM", path)
    return path


def assert_one_line_error(proc, code: int, *words: str) -> None:
    assert proc.returncode == code, proc
    assert "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and all(w in last for w in words), proc.stderr


def test_bad_model_path(tmp_path):
    assert_one_line_error(run_serve(str(tmp_path / "missing")), 2, "not a model directory")


def test_bad_flag_values(tiny_dir, tmp_path):
    assert_one_line_error(run_serve(str(tiny_dir), "--max-num-seqs", "0"), 2, "--max-num-seqs")
    empty = tmp_path / "keys"
    empty.write_text("# nothing\n")
    assert_one_line_error(run_serve(str(tiny_dir), "--auth-tokens-file", str(empty)), 2,
                          "holds no token")


def test_too_long_max_seq_len(tiny_dir):
    proc = run_serve(str(tiny_dir), "--backend", "numpy", "--port", "0", "--max-seq-len",
                     "100000")
    assert_one_line_error(proc, 1, "cannot load", "max_seq_len", "512")


def test_serves_and_stops(tiny_dir, tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("secret-1\n")
    proc = subprocess.Popen([*SERVE, str(tiny_dir), "--backend", "numpy", "--port", "0",
                             "--num-kv-blocks", "32", "--served-model-name", "tiny",
                             "--auth-tokens-file", str(keys)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = proc.stdout.readline()
        url = re.search(r"(http://\S+)/v1", first).group(1)
        assert wait_until(lambda: httpx.get(f"{url}/health").status_code == 200, timeout=60)
        ready = proc.stdout.readline()
        ready += proc.stdout.readline() if "model ready" not in ready else ""
        assert "model ready: tiny" in ready and "32 blocks" in ready and "numpy" in ready
        body = {"model": "tiny", "max_tokens": 3,
                "messages": [{"role": "user", "content": "hi"}]}
        assert httpx.post(f"{url}/v1/chat/completions", json=body).status_code == 401
        ok = httpx.post(f"{url}/v1/chat/completions", json=body,
                        headers={"Authorization": "Bearer secret-1"})
        assert ok.json()["usage"]["completion_tokens"] == 3
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) in (0, 130)  # 130: stopped by Ctrl-C
        proc.stdout.close()
        proc.stderr.close()
