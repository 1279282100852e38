"""Baseline: HF transformers (eager, bf16) on the same checkpoint and GPU. Test-time only:
imports torch lazily and is used only when ``--baseline hf`` is asked for."""

from __future__ import annotations

import time
from typing import Any


def hf_decode(path: str, concurrency: list[int], decode_tokens: int) -> dict[str, Any]:
    """Decode tok/s of ``transformers.generate`` at each batch size (prefill time subtracted)."""
    import torch
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).cuda().eval()
    vocab = model.config.vocab_size
    out: dict[str, Any] = {"library": f"transformers (torch {torch.__version__}, eager)"}

    def timed(batch: int, new: int) -> float:
        ids = torch.randint(0, vocab, (batch, 128), device="cuda")
        torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.no_grad():
            model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False)
        torch.cuda.synchronize()
        return time.perf_counter() - start

    for c in concurrency:
        timed(c, 2)
        full, one = timed(c, decode_tokens), timed(c, 1)
        out[str(c)] = c * (decode_tokens - 1) / (full - one)
    del model
    torch.cuda.empty_cache()
    return out
