"""Kill one worker of ``atlas serve -tp N`` mid-generation and check that the run fails the way
docs/multi-gpu.md ("Failures") promises: the streaming client gets an error (not a hang)
within the distributed timeout, the server exits non-zero within ``--exit-within`` seconds,
and no process of the server's tree is left behind.

    python scripts/multigpu_kill_check.py                          # 2 GPUs: cuda + NCCL
    python scripts/multigpu_kill_check.py --backend numpy          # CPU: numpy + cpu comm

The server serves a tiny random checkpoint (``write_tiny_checkpoint``) unless ``--model``
names a directory. The comm backend follows the GPU backend (``nccl`` for cuda, ``cpu``
otherwise: :func:`atlas_core.parallel.worker.comm_backend_name`), so the same script runs on
a machine without GPUs. Workers are the server's children started by multiprocessing's spawn
(``/proc/PID/task/*/children``), in rank order by pid. Prints one PASS / FAIL line per check
with its time and exits 0 only when every check passed.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROMPT_TOKENS_MARGIN = 64


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def children(pid: int) -> list[int]:
    """Direct children of ``pid`` (every thread's list); none once it is gone."""
    found: list[int] = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            found += [int(c) for c in (task / "children").read_text().split()]
    except OSError:
        pass
    return found


def tree(pid: int) -> list[int]:
    """``pid``'s descendants, depth first (``pid`` excluded)."""
    out: list[int] = []
    for child in children(pid):
        out += [child, *tree(child)]
    return out


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


def alive(pid: int) -> bool:
    """Running (a zombie, ended but not yet reaped, counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def workers(server_pid: int) -> list[int]:
    """The server's worker processes (multiprocessing spawn children), in rank order."""
    return sorted(p for p in children(server_pid) if "multiprocessing.spawn" in cmdline(p))


def report(ok: bool, what: str, lines: list[bool]) -> None:
    lines.append(ok)
    print(f"{'PASS' if ok else 'FAIL'} {what}", flush=True)


def wait_healthy(url_port: int, server: subprocess.Popen, timeout: float) -> float:
    """Seconds until ``/health`` answered 200; raises when the server died or took too long."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited with status {server.returncode} while "
                               "starting")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", url_port, timeout=2)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return time.monotonic() - start
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"/health did not turn 200 within {timeout:.0f} s")


def stream_and_kill(port: int, model: str, max_tokens: int, victim: int, timeout: float
                    ) -> tuple[str, float | None, int]:
    """Stream a chat completion, SIGKILL ``victim`` after the third data line, read on until
    the stream ends; ``(how it ended, seconds from the kill to that end, data lines)``. A read
    that waits longer than ``timeout`` without a byte ends as ``hang``."""
    body = json.dumps({"model": model, "stream": True, "max_tokens": max_tokens,
                       "ignore_eos": True, "temperature": 0,
                       "messages": [{"role": "user", "content": "hello there"}]})
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    response = conn.getresponse()
    if response.status != 200:
        return f"HTTP {response.status} before the kill: {response.read()[:200]!r}", None, 0
    killed_at, data, ending = None, 0, "eof"
    try:
        while True:
            line = response.readline()
            if not line:
                break
            text = line.decode(errors="replace").strip()
            if not text.startswith("data:"):
                continue
            data += 1
            if text == "data: [DONE]":
                ending = "done"
                break
            if '"error"' in text:
                ending = f"error event: {text[:160]}"
                break
            if data == 3 and killed_at is None:
                os.kill(victim, signal.SIGKILL)
                killed_at = time.monotonic()
    except socket.timeout:
        ending = "hang"
    except (OSError, http.client.HTTPException) as exc:
        ending = f"connection error: {type(exc).__name__}: {exc}"
    finally:
        conn.close()
    if killed_at is None:
        return f"the stream ended ({ending}) before the kill; raise --max-tokens", None, data
    return ending, time.monotonic() - killed_at, data


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", default="cuda", help="GpuBackend (default cuda; numpy on CPU)")
    p.add_argument("-tp", "--tensor-parallel-size", type=int, default=2, dest="tp")
    p.add_argument("--kill-rank", type=int, default=1, help="the worker killed (default 1)")
    p.add_argument("--distributed-timeout", type=float, default=30.0, metavar="SECONDS")
    p.add_argument("--exit-within", type=float, default=60.0, metavar="SECONDS",
                   help="the server must exit this soon after the kill (default 60)")
    p.add_argument("--start-timeout", type=float, default=600.0, metavar="SECONDS")
    p.add_argument("--max-tokens", type=int, default=None,
                   help="tokens asked for (default: the model's context less a margin)")
    p.add_argument("--model", default=None, help="model directory (default: a tiny random "
                   "Qwen3 checkpoint written to a temporary directory)")
    args = p.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="atlas-kill-check-"))
    model = args.model
    if model is None:
        from atlas_core.testing.checkpoints import write_tiny_checkpoint
        dtype = "bfloat16" if args.backend == "cuda" else "float32"
        # a long context, so that the stream outlasts the kill even at GPU speed
        model = str(write_tiny_checkpoint("Qwen3ForCausalLM", tmp / "model", dtype=dtype,
                                          max_position_embeddings=8192))
    context = json.loads((Path(model) / "config.json").read_text())["max_position_embeddings"]
    max_tokens = args.max_tokens or min(4000, int(context) - PROMPT_TOKENS_MARGIN)
    port, log_path = free_port(), tmp / "server.log"
    command = [sys.executable, "-m", "atlas_core", "serve", model, "--backend", args.backend,
               "-tp", str(args.tp), "--port", str(port),
               "--distributed-timeout", str(args.distributed_timeout)]
    print("$", " ".join(command), f"> {log_path}", flush=True)
    results: list[bool] = []
    log = open(log_path, "w")
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    family: list[int] = []
    try:
        print(f"healthy after {wait_healthy(port, server, args.start_timeout):.1f} s", flush=True)
        ranks = workers(server.pid)
        family = tree(server.pid)
        report(len(ranks) == args.tp, f"{len(ranks)} worker processes found for -tp {args.tp}: "
               f"{ranks}; server tree {[server.pid, *family]}", results)
        if len(ranks) <= args.kill_rank:
            raise RuntimeError(f"no worker of rank {args.kill_rank} to kill")
        victim = ranks[args.kill_rank]
        print(f"streaming {max_tokens} tokens; SIGKILL worker {args.kill_rank} (pid {victim}) "
              "after the third chunk", flush=True)
        client_limit = args.distributed_timeout + 15
        ending, after, chunks = stream_and_kill(port, model, max_tokens, victim, client_limit)
        got_error = after is not None and ending not in ("done", "hang")
        when = f"{after:.1f} s after the kill" if after is not None else "no kill"
        report(got_error and after <= args.distributed_timeout,
               f"client: {ending} ({when}, {chunks} data lines; limit "
               f"{args.distributed_timeout:.0f} s)", results)
        start = time.monotonic()
        try:
            code = server.wait(timeout=args.exit_within)
        except subprocess.TimeoutExpired:
            code = None
        waited = time.monotonic() - start + (after or 0.0)
        report(code not in (None, 0), f"server exit status {code} about {waited:.1f} s after "
               f"the kill (limit {args.exit_within:.0f} s)", results)
        deadline = time.monotonic() + 10
        while any(alive(pid) for pid in family) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = [pid for pid in [server.pid, *family] if alive(pid)]
        report(not left, "no process of the server's tree left" if not left else
               "left behind: " + "; ".join(f"{pid} {cmdline(pid)[:100]}" for pid in left),
               results)
    except RuntimeError as exc:
        report(False, str(exc), results)
    finally:
        for pid in [*family, server.pid]:
            if alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        server.wait()
        log.close()
        if shutil.which("nvidia-smi"):
            apps = subprocess.run(["nvidia-smi", "--query-compute-apps=pid",
                                   "--format=csv,noheader"], capture_output=True, text=True)
            print(f"nvidia-smi compute apps after the run: {apps.stdout.split() or 'none'}")
        if not all(results):
            print(f"--- last lines of {log_path} ---")
            print("\n".join(log_path.read_text(errors="replace").splitlines()[-40:]))
    ok = bool(results) and all(results)
    if ok:
        shutil.rmtree(tmp, ignore_errors=True)
    print("PASS multigpu kill check" if ok else "FAIL multigpu kill check", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
