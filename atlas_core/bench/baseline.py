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


def hf_bench(model: Any, concurrency: list[int], decode_tokens: int,
             prompt_len: int = 0) -> dict[str, Any]:
    """Decode tok/s of ``generate`` at each batch size (prefill time subtracted) and, when
    ``prompt_len`` is given, the time to the first token of one such prompt."""
    import torch
    vocab = model.config.vocab_size
    out: dict[str, Any] = {"library": f"transformers (torch {torch.__version__}, eager)",
                           "decode_tokens": decode_tokens}

    def timed(batch: int, new: int, length: int = 128) -> float:
        ids = torch.randint(0, vocab, (batch, length), device="cuda")
        torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.no_grad():
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                           min_new_tokens=new, do_sample=False)
        torch.cuda.synchronize()
        return time.perf_counter() - start

    for c in concurrency:
        timed(c, 2)
        full, one = timed(c, decode_tokens), timed(c, 1)
        out[str(c)] = c * (decode_tokens - 1) / (full - one)
    if prompt_len:
        timed(1, 1, prompt_len)
        out["ttft_s"] = timed(1, 1, prompt_len)
        out["prefill_tok_s"] = prompt_len / out["ttft_s"]
    return out


def hf_decode(path: str, concurrency: list[int], decode_tokens: int) -> dict[str, Any]:
    """Decode tok/s of ``transformers.generate`` on a checkpoint directory."""
    return hf_bench(hf_model(path), concurrency, decode_tokens)


def run_isolated(spec: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
    """Run :func:`main` on ``spec`` in a child process; ``{"error": ...}`` when it fails."""
    import subprocess
    cmd = [sys.executable, "-m", "atlas_core.bench.baseline", json.dumps(spec)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"HF baseline did not finish in {timeout:.0f} s"}
    lines = proc.stdout.strip().splitlines()
    if proc.returncode or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"HF baseline failed (exit {proc.returncode}): {tail}"}
    return json.loads(lines[-1])


def main(argv: list[str]) -> int:
    """``SPEC_JSON``: ``{"path" | "config", "concurrency", "decode_tokens", "prompt_len"}``;
    prints the result as one JSON line."""
    spec = json.loads(argv[0])
    start = time.perf_counter()
    model = hf_model(spec.get("path"), spec.get("config"))
    load_s = time.perf_counter() - start
    result = hf_bench(model, spec["concurrency"], spec["decode_tokens"], spec.get("prompt_len", 0))
    result["load_s"] = load_s
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
