"""``atlas serve -tp 2`` on the numpy backend as a real subprocess: it serves, and when a
worker is killed mid-generation the client gets an error, the server exits non-zero and no
worker process is left behind. Slow (a server and two workers start): marked ``slow``."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from atlas_core.testing.checkpoints import write_tiny_checkpoint
from atlas_core.testing.serving import free_port, wait_healthy

pytestmark = pytest.mark.slow


def _children(pid):
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


def _is_worker(pid):
    try:
        return b"multiprocessing.spawn" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def test_killed_worker_fails_the_request_and_the_server_exits(tmp_path):
    path = write_tiny_checkpoint("Qwen3ForCausalLM", tmp_path / "model")
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "atlas_core", "serve", str(path),
                               "--backend", "numpy", "-tp", "2", "--port", str(port),
                               "--num-kv-blocks", "64", "--distributed-timeout", "60"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(server, port)
        workers = [p for p in _children(server.pid) if _is_worker(p)]
        assert len(workers) == 2
        body = {"model": str(path), "prompt": "hello", "max_tokens": 400, "stream": True,
                "ignore_eos": True}
        lines = []
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as response:
            for line in response.iter_lines():
                lines.append(line)
                if len(lines) == 3:
                    os.kill(workers[1], signal.SIGKILL)
        assert any("error" in line for line in lines), lines[-3:]
        assert server.wait(timeout=60) != 0
        time.sleep(1)
        assert not [p for p in workers if Path(f"/proc/{p}").exists() and _is_worker(p)]
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
