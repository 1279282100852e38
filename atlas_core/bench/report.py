"""A :class:`~atlas_core.bench.runner.BenchResult` as a compact table, JSON, or CSV (one row per
engine x cell, for plotting)."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
from typing import Any

from atlas_core.bench.runner import BenchResult

CSV_FIELDS = ("engine", "batch", "context", "status", "ttft_s", "prefill_tok_s", "step_ms",
              "tok_s", "floor_ms", "pct_floor", "step_gb")


def to_json(result: BenchResult) -> str:
    return json.dumps(dataclasses.asdict(result), indent=2)


def _baseline_cells(result: BenchResult) -> dict[str, dict[tuple[int, int], dict]]:
    return {name: {(c["batch"], c["context"]): c for c in base.get("cells", [])}
            for name, base in result.baselines.items()}


def _num(value: Any, fmt: str) -> str:
    if isinstance(value, (int, float)):
        return format(value, fmt)
    width = fmt.lstrip(">").split(",")[0].split(".")[0]
    return "-".rjust(int(width or 1))


def _decode_rows(result: BenchResult, bases: dict) -> list[str]:
    head = "batch | context | step ms |      tok/s | floor ms | % floor | GB/step"
    head += "".join(f" | {name} tok/s | x {name}" for name in bases)
    rows = [head]
    for cell in result.cells:
        b, c = cell["batch"], cell["context"]
        if cell["status"] != "ok":
            rows.append(f"{b:>5} | {c:>7} | {cell['status']}")
            continue
        row = (f"{b:>5} | {c:>7} | {cell['step_ms']:>7.2f} | {cell['tok_s']:>10,.1f} | "
               f"{_num(cell.get('floor_ms'), '>8.2f')} | {_num(cell.get('pct_floor'), '>6.1f')}% | "
               f"{cell['step_gb']:>7.3f}")
        for name, by_cell in bases.items():
            base_tok = by_cell.get((b, c), {}).get("tok_s")
            ratio = cell["tok_s"] / base_tok if base_tok else None
            row += (f" | {_num(base_tok, f'>{len(name) + 6},.1f')}"
                    f" | {_num(ratio, f'>{len(name) + 1}.2f')}")
        rows.append(row)
    return rows


def _prefill_rows(result: BenchResult, bases: dict) -> list[str]:
    head = "batch | context | TTFT ms | prefill tok/s"
    head += "".join(f" | {name} TTFT ms" for name in bases)
    rows = [head]
    for cell in result.cells:
        if cell["status"] != "ok":
            continue
        b, c = cell["batch"], cell["context"]
        row = f"{b:>5} | {c:>7} | {1e3 * cell['ttft_s']:>7.1f} | {cell['prefill_tok_s']:>13,.0f}"
        for name, by_cell in bases.items():
            ttft = by_cell.get((b, c), {}).get("ttft_s")
            row += f" | {_num(1e3 * ttft if ttft else None, f'>{len(name) + 8}.1f')}"
        rows.append(row)
    return rows


def to_text(result: BenchResult) -> str:
    """The compact table: decode per cell beside each baseline, then prefill per cell."""
    bw = (f"{result.bandwidth_gbs:,.0f} GB/s ({result.bandwidth_source})" if result.bandwidth_gbs
          else f"n/a ({result.bandwidth_source})")
    lines = [f"model {result.model} on {result.device} ({result.backend} backend)",
             f"memory bandwidth for the floor: {bw}",
             f"cold start (weights + KV cache + first compile): {result.cold_start_s:.2f} s",
             f"decode: {result.decode_tokens} tokens per request after a prefill of the cell's "
             "context; floor = bytes read per step / bandwidth"]
    if result.shape:
        lines.append(result.shape)
    if result.kv:
        lines.append(result.kv)
    if result.matmul:
        lines.append(f"matmuls of more than one row: {result.matmul}")
    if result.per_rank:
        lines.append(f"split over {result.per_rank} GPUs: GB/step and the floor are PER RANK, "
                     "the rank that reads the most (its weight shard, its experts' share of the "
                     "batch, its KV heads) over one GPU's bandwidth")
    bases = _baseline_cells(result)
    lines += _decode_rows(result, bases)
    lines.append("prefill: every prompt of a cell submitted at once (TTFT = until all have "
                 "their first token)")
    lines += _prefill_rows(result, bases)
    for name, base in result.baselines.items():
        detail = base.get("error") or base.get("library", "")
        lines.append(f"baseline {name}: {detail}")
        lines += [f"  batch {c['batch']} context {c['context']}: {c['error']}"
                  for c in base.get("cells", []) if c.get("error")]
    return "\n".join(lines)


def to_csv(result: BenchResult) -> str:
    """One row per engine (``atlas`` and each baseline) and cell, columns :data:`CSV_FIELDS`."""
    out = io.StringIO()
    writer = csv.DictWriter(out, CSV_FIELDS, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for cell in result.cells:
        writer.writerow({"engine": "atlas", **cell})
    for name, base in result.baselines.items():
        for cell in base.get("cells", []):
            writer.writerow({"engine": name, "status": cell.get("error", "ok"), **cell})
    return out.getvalue()
