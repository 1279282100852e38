"""Helpers of ``scripts/multigpu_x4.sh``: the small Python pieces of its steps, each printing
one or two compact lines (the device returns only the tail of a call's output, so every line
here is a result, never a progress message).

    python scripts/multigpu_x4_util.py big-shape N MEM_MIB      # the 235B variant that fits
    python scripts/multigpu_x4_util.py serve-dir SHAPE DIR TOKENIZER_DIR
    python scripts/multigpu_x4_util.py dry-tokenizer DIR SHAPE  # tiny tokenizer, gzipped
    python scripts/multigpu_x4_util.py free-port
    python scripts/multigpu_x4_util.py wait-health PORT PID TIMEOUT_S
    python scripts/multigpu_x4_util.py chat PORT MODEL
    python scripts/multigpu_x4_util.py scaling LABEL TARGETS NAME@JSON...

Kept apart from the shell script so that parsing bench JSON and talking HTTP are plain Python
(testable on CPU through the script's ``DRY=1`` mode) instead of grep pipelines, which lost
rows on earlier device calls.
"""

from __future__ import annotations

import gzip
import http.client
import json
import os
import shutil
import sys
import time
from pathlib import Path

from multigpu_kill_check import alive, free_port  # the scripts folder: both run from there

#: The Qwen3-235B-A22B variants, largest first: a rank must hold weights / N of it.
BIG_SHAPES = (("qwen3-235b-a22b", 2.0), ("qwen3-235b-a22b-fp8", 1.0))
#: Share of a GPU's memory a weight shard may take (the rest: KV cache, activations, graphs).
SHARD_SHARE = 0.85


def weight_bytes(config: dict, itemsize: float) -> float:
    """All weights of a shape (every expert touched), at ``itemsize`` bytes a parameter."""
    from atlas_core.bench.shapes import step_bytes
    experts = int(config.get("num_experts") or 1)
    return step_bytes(config, 0, batch=experts, itemsize=1) * itemsize


def big_shape(n: int, mem_mib: int) -> str:
    """The largest 235B variant whose per-rank shard fits ``SHARD_SHARE`` of one GPU."""
    from atlas_core.bench.shapes import shape_config
    for name, itemsize in BIG_SHAPES:
        per_rank = weight_bytes(shape_config(name), itemsize) / n
        if per_rank < SHARD_SHARE * mem_mib * 2**20:
            return name
    return "none"


def _tokenizer_files(src: Path) -> list[Path]:
    return [p for p in (src / "tokenizer.json", src / "tokenizer.json.gz") if p.is_file()]


def serve_dir(shape: str, target: Path, tokenizer_dir: Path) -> int:
    """A ``--load-format dummy`` model directory: the shape's config.json plus the tokenizer
    files of ``tokenizer_dir`` (``tokenizer.json`` may come gzipped: carried folders count
    against the device's 64 MiB, and Qwen's tokenizer.json is 11 MB)."""
    from atlas_core.bench.shapes import shape_config
    found = _tokenizer_files(tokenizer_dir)
    if not found or not (tokenizer_dir / "tokenizer_config.json").is_file():
        print(f"serve dir: no tokenizer.json(.gz) + tokenizer_config.json in {tokenizer_dir}")
        return 2
    target.mkdir(parents=True, exist_ok=True)
    (target / "config.json").write_text(json.dumps(shape_config(shape), indent=2))
    # contents only, not modes: a read-only source must not block the next call's rewrite
    (target / "tokenizer_config.json").write_bytes(
        (tokenizer_dir / "tokenizer_config.json").read_bytes())
    opener = gzip.open if found[0].suffix == ".gz" else open
    with opener(found[0], "rb") as src, open(target / "tokenizer.json", "wb") as dst:
        shutil.copyfileobj(src, dst)
    print(f"serve dir: {shape} config + tokenizer from {found[0]}")
    return 0


def dry_tokenizer(target: Path, shape: str) -> int:
    """The CI tokenizer sized for a tiny shape, its tokenizer.json gzipped like a carried one."""
    from atlas_core.bench.shapes import shape_config
    from atlas_core.testing.tiny_tokenizer import write_tokenizer
    config = shape_config(shape)
    target.mkdir(parents=True, exist_ok=True)
    write_tokenizer(target, config["vocab_size"], config.get("max_position_embeddings", 2048))
    raw = target / "tokenizer.json"
    with open(raw, "rb") as src, gzip.open(target / "tokenizer.json.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    raw.unlink()
    return 0


def print_free_port() -> int:
    print(free_port())
    return 0


def wait_health(port: int, pid: int, timeout: float) -> int:
    """Poll ``/health`` until 200; 1 when the server died or ``timeout`` passed."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if not alive(pid):
            print(f"serve: the server exited before /health answered "
                  f"({time.monotonic() - start:.1f} s)")
            return 1
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                print(f"serve: healthy after {time.monotonic() - start:.1f} s")
                return 0
        except OSError:
            pass
        time.sleep(0.5)
    print(f"serve: /health not 200 within {timeout:.0f} s")
    return 1


def chat(port: int, model: str) -> int:
    """One chat completion: its time, the first 300 characters and the usage."""
    body = json.dumps({"model": model, "max_tokens": 48, "temperature": 0,
                       "messages": [{"role": "user", "content": "Say hello in five words."}]})
    start = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        raw = response.read()
    except (OSError, http.client.HTTPException) as exc:
        print(f"chat: {type(exc).__name__}: {exc}")
        return 1
    took = time.monotonic() - start
    if response.status != 200:
        print(f"chat: HTTP {response.status} after {took:.1f} s: {raw[:300]!r}")
        return 1
    out = json.loads(raw)
    text = (out["choices"][0]["message"].get("content") or "").replace("\n", " ")
    print(f"chat: {took:.1f} s, usage {json.dumps(out.get('usage'))}")
    print(f"chat text (random weights): {text[:300]!r}")
    return 0


def _tok_s(path: Path) -> dict[int, float]:
    """``{batch: decode tok/s}`` of a bench JSON (cells that ran; empty when the run failed)."""
    try:
        cells = json.loads(path.read_text())["cells"]
    except (OSError, ValueError, KeyError):
        return {}
    return {c["batch"]: c["tok_s"] for c in cells if c.get("status") == "ok" and c.get("tok_s")}


def scaling(label: str, targets: str, runs: list[str]) -> int:
    """One line per batch: decode tok/s of every run in ``runs`` (``NAME@FILE``, the first the
    base) and each other run's ratio to the base, against ``targets`` (``NAME:RATIO,...`` such
    as ``TP=2:1.6,TP=4:2.4``; ``-`` for none). A run that failed or was skipped reads n/a."""
    want = dict(t.rsplit(":", 1) for t in targets.split(",") if ":" in t)
    named = [(name, _tok_s(Path(f))) for name, f in (r.rsplit("@", 1) for r in runs)]
    base = named[0][1]
    batches = sorted({b for _, got in named for b in got})
    if not batches:
        print(f"{label}: no decode results (every run failed or was skipped)")
        return 0
    for batch in batches:
        parts = []
        for i, (name, got) in enumerate(named):
            if batch not in got:
                parts.append(f"{name} n/a")
                continue
            part = f"{name} {got[batch]:,.1f} tok/s"
            if i and base.get(batch):
                ratio = got[batch] / base[batch]
                part += f" {ratio:.2f}x"
                if name in want:
                    verdict = "met" if ratio >= float(want[name]) else "MISSED"
                    part += f" (target {want[name]}x {verdict})"
            parts.append(part)
        print(f"{label} batch {batch}: " + " | ".join(parts))
    return 0


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    cmd, args = argv[0], argv[1:]
    if cmd == "big-shape":
        print(big_shape(int(args[0]), int(args[1])))
        return 0
    if cmd == "serve-dir":
        return serve_dir(args[0], Path(args[1]), Path(args[2]))
    if cmd == "dry-tokenizer":
        return dry_tokenizer(Path(args[0]), args[1])
    if cmd == "free-port":
        return print_free_port()
    if cmd == "wait-health":
        return wait_health(int(args[0]), int(args[1]), float(args[2]))
    if cmd == "chat":
        return chat(int(args[0]), args[1])
    if cmd == "scaling":
        return scaling(args[0], args[1], args[2:])
    print(f"unknown command {cmd!r}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    os.environ.setdefault("ATLAS_LOG_LEVEL", "WARNING")
    sys.exit(main(sys.argv[1:]))
