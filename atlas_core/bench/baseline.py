"""Baseline: HF transformers (eager, bf16) on the same GPU. Test-time only: torch is imported
lazily, and ``atlas bench --baseline hf`` runs this module in its own process before Atlas
loads (``python -m atlas_core.bench.baseline SPEC_JSON``), so the two never share the GPU."""

from __future__ import annotations

import json
import sys
import time
from typing import Any


def hf_model(path: str | None = None, config: dict[str, Any] | None = None) -> Any:
    """The HF model of a checkpoint directory, or of a config built with random init directly
    on the GPU (``from_config`` under ``torch.device("cuda")``: nothing is read from disk)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    if path is not None:
        return AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).cuda().eval()
    fields = {k: v for k, v in config.items() if k not in ("model_type", "architectures")}
    hf_config = AutoConfig.for_model(config["model_type"], **fields)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(hf_config, dtype=torch.bfloat16)
    return model.eval()


def hf_bench(model: Any, batches: list[int], contexts: list[int],
             decode_tokens: int) -> dict[str, Any]:
    """Decode tok/s of ``generate`` at each batch x context cell (the prefill's time
    subtracted) and the time to the first token of the cell's batched prompts."""
    import torch
    vocab = model.config.vocab_size
    out: dict[str, Any] = {"library": f"transformers (torch {torch.__version__}, eager)",
                           "decode_tokens": decode_tokens, "cells": []}

    def timed(batch: int, new: int, length: int) -> float:
        ids = torch.randint(0, vocab, (batch, length), device="cuda")
        torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.no_grad():
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                           min_new_tokens=new, do_sample=False)
        torch.cuda.synchronize()
        return time.perf_counter() - start

    for context in contexts:
        for batch in batches:
            cell: dict[str, Any] = {"batch": batch, "context": context}
            try:
                timed(batch, 2, min(context, 16))
                full, one = timed(batch, decode_tokens, context), timed(batch, 1, context)
            except Exception as exc:  # noqa: BLE001 - an out-of-memory cell is a result too
                cell["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                torch.cuda.empty_cache()
            else:
                step = (full - one) / (decode_tokens - 1)
                cell.update(step_ms=1e3 * step, tok_s=batch / step, ttft_s=one,
                            prefill_tok_s=batch * context / one)
            out["cells"].append(cell)
            print(json.dumps({"cell": cell}), flush=True)
    return out


def hf_decode(path: str, batches: list[int], contexts: list[int],
              decode_tokens: int) -> dict[str, Any]:
    """:func:`hf_bench` of ``transformers.generate`` on a checkpoint directory."""
    return hf_bench(hf_model(path), batches, contexts, decode_tokens)


def _text(data: str | bytes | None) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else data or ""


def read_result(stdout: str) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """``(final result or None, cells)`` from a baseline's stdout: one ``{"cell": ...}`` JSON
    line per finished cell, then the whole result as the last line."""
    final, cells = None, []
    for line in stdout.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and "cell" in record:
            cells.append(record["cell"])
        elif isinstance(record, dict) and "cells" in record:
            final = record
    return final, cells


def _command(module: str, spec: dict[str, Any]) -> list[str]:
    return [sys.executable, "-m", module, json.dumps(spec)]


def run_isolated(spec: dict[str, Any], timeout: float | None = None,
                 module: str = "atlas_core.bench.baseline",
                 label: str = "HF baseline") -> dict[str, Any]:
    """Run ``python -m module SPEC_JSON`` in a child process and read its result (see
    :func:`read_result`); on failure, timeout or Ctrl-C, ``{"error": ..., "cells": [what
    finished]}``. The child's stderr (its progress: which cell it compiles or runs) is passed
    through line by line, prefixed with ``label``, so a slow baseline shows where it is."""
    import subprocess
    import threading
    proc = subprocess.Popen(_command(module, spec), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, errors="replace")
    out: list[str] = []
    err: list[str] = []

    def relay() -> None:
        for line in proc.stderr:
            err.append(line)
            del err[:-50]
            print(f"[{label}] {line.rstrip()}", file=sys.stderr, flush=True)

    threads = [threading.Thread(target=lambda: out.extend(proc.stdout), daemon=True),
               threading.Thread(target=relay, daemon=True)]
    for thread in threads:
        thread.start()
    stop = None
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop = (f"{label} did not finish in {timeout:.0f} s ({{}} cells done; raise "
                "--baseline-timeout)")
    except KeyboardInterrupt:
        stop = f"{label} interrupted ({{}} cells done)"
    if stop is not None:
        proc.kill()
        proc.wait()
    for thread in threads:
        thread.join(timeout=5)
    final, cells = read_result("".join(out))
    if stop is not None:
        return {"error": stop.format(len(cells)), "cells": cells}
    if proc.returncode or final is None:
        tail = ("".join(err).strip().splitlines() or ["no output"])[-1]
        return {"error": f"{label} failed (exit {proc.returncode}): {tail}", "cells": cells}
    return final


def main(argv: list[str]) -> int:
    """``SPEC_JSON``: ``{"path" | "config", "batches", "contexts", "decode_tokens"}``; prints
    one ``{"cell": ...}`` JSON line per finished cell, then the whole result as one JSON line."""
    spec = json.loads(argv[0])
    start = time.perf_counter()
    model = hf_model(spec.get("path"), spec.get("config"))
    load_s = time.perf_counter() - start
    result = hf_bench(model, spec["batches"], spec["contexts"], spec["decode_tokens"])
    result["load_s"] = load_s
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
