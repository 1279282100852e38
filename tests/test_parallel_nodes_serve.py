"""Two "nodes" on one host, each an ``atlas serve`` process on the numpy backend (issue #26's
recipes, as docs/multi-gpu.md gives them): ``--nnodes 2 --node-rank 0/1 --master-addr/-port``,
and torchrun's rank environment (``RANK`` / ``WORLD_SIZE`` / ``MASTER_*``, no ``-tp``). Node 0
serves HTTP with the tokens of a one-process server; one SIGINT to it ends both processes.
Slow (three servers start): marked ``slow``."""

import os
import signal
import subprocess
import sys

import httpx
import pytest

from atlas_core.testing.checkpoints import write_tiny_checkpoint
from atlas_core.testing.serving import free_port, wait_healthy

pytestmark = pytest.mark.slow

REQUEST = {"prompt": "hello world", "max_tokens": 8, "temperature": 0}


def _serve(path, port, *flags, env=None):
    return subprocess.Popen(
        [sys.executable, "-m", "atlas_core", "serve", str(path), "--backend", "numpy",
         "--port", str(port), "--num-kv-blocks", "64", *flags],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, **(env or {})})


def _text(server, port):
    wait_healthy(server, port)
    reply = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=REQUEST, timeout=60)
    assert reply.status_code == 200, reply.text
    return reply.json()["choices"][0]["text"]


def _stop(front, others):
    front.send_signal(signal.SIGINT)
    for proc in (front, *others):
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            pytest.fail(f"a process outlived node 0's SIGINT: {proc.args}")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = write_tiny_checkpoint("Qwen3ForCausalLM", tmp_path_factory.mktemp("nodes") / "m")
    port = free_port()
    single = _serve(path, port)
    try:
        text = _text(single, port)
    finally:
        _stop(single, [])
    return path, text


def test_two_nodes_by_flags(model):
    path, want = model
    port, master = free_port(), free_port()
    common = ["-tp", "2", "--nnodes", "2", "--master-addr", "127.0.0.1", "--master-port",
              str(master), "--distributed-timeout", "60"]
    node1 = _serve(path, free_port(), *common, "--node-rank", "1")
    node0 = _serve(path, port, *common, "--node-rank", "0")
    try:
        assert _text(node0, port) == want
    finally:
        _stop(node0, [node1])


def test_two_ranks_by_torchrun_environment(model):
    path, want = model
    port, master = free_port(), free_port()
    env = {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(master)}
    rank1 = _serve(path, port, "--distributed-timeout", "60",
                   env={**env, "RANK": "1", "LOCAL_RANK": "1"})
    rank0 = _serve(path, port, "--distributed-timeout", "60",
                   env={**env, "RANK": "0", "LOCAL_RANK": "0"})
    try:
        assert _text(rank0, port) == want
    finally:
        _stop(rank0, [rank1])
