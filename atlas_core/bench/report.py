"""Printing and JSON of a :class:`~atlas_core.bench.runner.BenchResult`."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from atlas_core.bench.runner import BenchResult


def to_json(result: BenchResult) -> str:
    return json.dumps(dataclasses.asdict(result), indent=2)


def to_text(result: BenchResult) -> str:
    lines = [f"model {result.model} on {result.device} ({result.backend} backend)",
             f"device copy bandwidth: {result.copy_bandwidth_gbs:,.0f} GB/s (read + write)",
             f"cold start (weights + KV cache + first compile): {result.cold_start_s:.2f} s",
             f"prompt {result.prompt_len} tokens: TTFT {1e3 * result.ttft_s:.1f} ms, "
             f"prefill {result.prefill_tok_s:,.0f} tok/s",
             "batch | decode tok/s | step ms | GB/s | % roofline | roofline tok/s | baseline tok/s"]
    for c, d in result.decode.items():
        base: Any = result.baseline.get(str(c))
        base_s = f"{base:,.1f}" if isinstance(base, float) else "-"
        lines.append(f"{c:>5} | {d['tok_s']:>12,.1f} | {d['step_ms']:>7.2f} | {d['gb_s']:>6,.0f} | "
                     f"{d['pct_roofline']:>9.1f}% | {d['roofline_tok_s']:>14,.0f} | {base_s:>14}")
    base = result.baseline
    if base.get("prefill_tok_s"):
        lines.append(f"baseline prompt {result.prompt_len} tokens: TTFT "
                     f"{1e3 * base['ttft_s']:.1f} ms, prefill {base['prefill_tok_s']:,.0f} tok/s")
    if base.get("error"):
        lines.append(f"baseline: {base['error']}")
    elif base:
        lines.append(f"baseline: {base.get('library', '')}, {base.get('decode_tokens')} tokens "
                     "per request")
    return "\n".join(lines)
