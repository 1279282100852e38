"""The measurements of ``atlas bench``: a matrix of batch sizes x context lengths.

Each cell prefills ``batch`` distinct prompts of ``context`` tokens at once (the batched TTFT
and prefill rate), then times the decode steps that follow, AT that context: only steps that
decode every sequence of the batch (the first sequences keep decoding while the last ones
prefill, and the cell ends after ``decode_tokens`` whole-batch steps). The floor of a
cell is :class:`~atlas_core.engine.step_timing.StepBytes` at the mean context of the timed steps
over the device bandwidth (under ``-tp``, the bytes of the rank that reads the most over one GPU's
bandwidth). A cell whose KV cache cannot fit is reported as skipped, not run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from atlas_core.engine.step_timing import StepBytes

_GIB = 1 << 30


@dataclass
class BenchResult:
    """Everything one bench run measured (times in seconds, rates per second).

    ``cells`` holds one :func:`measure_cell` dict per batch x context; ``baselines`` one
    result per baseline (``"hf"``, ``"compiled"``), each with its own ``cells``. ``per_rank``:
    the number of ranks of a ``-tp`` run, whose ``step_gb`` and floor are per rank (0: one GPU).
    """

    model: str
    backend: str
    device: str
    bandwidth_gbs: float = 0.0
    bandwidth_source: str = ""
    cold_start_s: float = 0.0
    decode_tokens: int = 0
    cells: list[dict[str, Any]] = field(default_factory=list)
    baselines: dict[str, dict[str, Any]] = field(default_factory=dict)
    per_rank: int = 0
    #: What ran matmuls of more than one row (the backend's ``matmul_library()``; "" when it
    #: does not say): a GPU run without cuBLASLt measures another configuration.
    matmul: str = ""
    #: The shape's layers and per-layer bytes (:func:`~atlas_core.bench.shapes.shape_note`) and
    #: the KV cache's bytes a token as the engine sized it (:func:`kv_note`; "" when unknown).
    shape: str = ""
    kv: str = ""


def kv_note(kv_config: Any) -> str:
    """The paged KV cache's bytes a token of context over every layer it holds (a latent for
    MLA, K and V for attention) from the engine's plan, ``""`` without one."""
    if kv_config is None or not getattr(kv_config, "bytes_per_block", 0):
        return ""
    note = (f"KV cache: {kv_config.bytes_per_block // kv_config.block_size:,} bytes a token of "
            "context over the paged layers")
    if getattr(kv_config, "window_pool", None) is not None:
        note += " (the sliding-window layers keep their window apart)"
    return note


class CellFailed(RuntimeError):
    """A request of a bench cell finished with an engine error (the message says which)."""


def _run(engine: Any, prompts: list[list[int]], max_tokens: int,
         full_steps: int | None = None) -> tuple[float, list[tuple]]:
    """Submit ``prompts`` together; return (seconds until every one has its first token,
    ``(end time, tokens, all started)`` of each step that produced tokens). With
    ``full_steps``: once that many steps after the last first token produced a token for every
    prompt, the rest are aborted (the decode phase of a matrix cell)."""
    from atlas_core.engine import SamplingParams
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    ids = [f"bench-{time.monotonic_ns()}-{i}" for i in range(len(prompts))]
    for rid, p in zip(ids, prompts):
        engine.add_request(rid, p, params)
    start = time.perf_counter()
    started: set[str] = set()
    first, stamps, full = 0.0, [], 0
    while engine.has_unfinished_requests():
        outs = engine.step()
        now = time.perf_counter()
        if not outs:
            continue
        error = next((o.error for o in outs if getattr(o, "error", None)), None)
        if error:  # an engine step failed (out of memory, a kernel error): stop the cell
            for rid in ids:
                engine.abort_request(rid)
            while engine.has_unfinished_requests():
                engine.step()
            raise CellFailed(str(error))
        was_full = len(started) == len(ids)
        started.update(o.request_id for o in outs if o.outputs[0].token_ids)
        if not was_full and len(started) == len(ids):
            first = now - start
        stamps.append((now, len(outs), was_full))
        full += was_full and len(outs) == len(ids)
        if full_steps is not None and full > full_steps:
            for rid in ids:
                engine.abort_request(rid)
    return first, stamps


def lead_tokens(max_prefill_tokens: int, batch: int, context: int) -> int:
    """Tokens the first sequences of a cell may decode while the last ones still prefill (one a
    prefill step, the prefill taking about ``batch * context / max_prefill_tokens`` steps):
    their budget, so that every sequence is still running when the last one starts."""
    return -(-batch * context // max(int(max_prefill_tokens), 1)) + 2


def kv_need(engine: Any, batch: int, tokens: int) -> tuple[int, int]:
    """``(blocks needed, blocks in the pool)`` for ``batch`` sequences of ``tokens`` tokens."""
    bs = engine.kv_config.block_size
    return batch * -(-tokens // bs), engine.block_manager.num_blocks


def skip_reason(engine: Any, batch: int, context: int, decode_tokens: int) -> str | None:
    """Why a cell cannot run on this engine (``None``: it can)."""
    lead = lead_tokens(engine.args.max_prefill_tokens, batch, context)
    tokens = context + decode_tokens + lead + 1
    model_max = int(engine.model.max_position_embeddings)
    if tokens > model_max:
        return (f"skipped: context {context} + {decode_tokens} decode tokens exceeds the "
                f"model's max_position_embeddings {model_max}")
    if batch > engine.args.max_num_seqs:
        return f"skipped: batch {batch} exceeds max_num_seqs {engine.args.max_num_seqs}"
    pool, bs = getattr(engine.kv_config, "window_pool", None), engine.kv_config.block_size
    if pool is not None and batch * min(-(-tokens // bs),
                                        -(-pool.window // bs) + 2) > pool.num_blocks:
        return (f"skipped: {batch} sliding windows of {pool.window} tokens need more than the "
                f"{pool.num_blocks} blocks of the window pool (raise --gpu-memory-utilization)")
    if tokens > engine.max_seq_len:
        return (f"skipped: context {context} + {decode_tokens} decode tokens (+ "
                f"{tokens - context - decode_tokens} while the batch prefills) exceed the "
                f"engine's max_seq_len {engine.max_seq_len}")
    need, have = kv_need(engine, batch, tokens)
    if need > have:
        per = engine.kv_config.bytes_per_block
        state = batch * getattr(engine.kv_config, "state_bytes_per_slot", 0)
        return (f"skipped: needs {(need * per + state) / _GIB:.2f} GiB of KV cache, "
                f"{have * per / _GIB:.2f} GiB fit (raise --gpu-memory-utilization)")
    return None


def measure_cell(engine: Any, step_bytes: StepBytes, batch: int, context: int,
                 decode_tokens: int, bandwidth_gbs: float, rng: np.random.Generator) -> dict:
    """Prefill ``batch`` prompts of ``context`` tokens, then time decode at that context."""
    cell: dict[str, Any] = {"batch": batch, "context": context, "status": "ok"}
    reason = skip_reason(engine, batch, context, decode_tokens)
    if reason:
        cell["status"] = reason
        return cell
    vocab = engine.model.vocab_size
    prompts = [rng.integers(0, vocab, context).tolist() for _ in range(batch)]
    lead = lead_tokens(engine.args.max_prefill_tokens, batch, context)
    try:
        ttft, stamps = _run(engine, prompts, decode_tokens + lead, full_steps=decode_tokens)
    except CellFailed as exc:
        cell["status"] = f"failed: {exc}"
        return cell
    decode = [s for s in stamps if s[2] and s[1] == batch]
    if len(decode) < 3:
        cell["status"] = (f"skipped: {len(decode)} decode steps of the whole batch timed; "
                          "raise --decode-tokens")
        return cell
    steps, elapsed = len(decode) - 1, decode[-1][0] - decode[0][0]
    tokens = sum(n for _, n, _ in decode[1:])
    step_s = elapsed / steps
    mean_context = context + decode_tokens // 2
    nbytes = step_bytes(batch, batch * mean_context)
    cell.update(ttft_s=ttft, prefill_tok_s=batch * context / ttft if ttft else 0.0,
                step_ms=1e3 * step_s, tok_s=tokens / elapsed, step_gb=nbytes / 1e9,
                gb_s=nbytes / step_s / 1e9)
    if bandwidth_gbs:
        floor_s = nbytes / (bandwidth_gbs * 1e9)
        cell.update(floor_ms=1e3 * floor_s, floor_tok_s=batch / floor_s,
                    pct_floor=100 * floor_s / step_s)
    return cell


def measure(engine: Any, *, batches: list[int], contexts: list[int], decode_tokens: int,
            bandwidth_gbs: float, log=print, seed: int = 0) -> list[dict[str, Any]]:
    """Every cell of ``batches`` x ``contexts`` (see the module docstring), after warm-ups:
    one short request per batch size (graphs, plans) and one prompt per context length (the
    prefill workspace)."""
    rng = np.random.default_rng(seed)
    vocab = engine.model.vocab_size
    # the engine's own count: under -tp, the busiest rank's shard (BusiestRankBytes)
    step_bytes = engine.decode_timer.step_bytes
    log("warm-up")
    warm = [(b, 16, 8) for b in batches] + [(1, c, 1) for c in contexts]
    for b, c, n in warm:
        if skip_reason(engine, b, c, n) is None:
            try:
                _run(engine, [rng.integers(0, vocab, c).tolist() for _ in range(b)], n)
            except CellFailed as exc:  # the cell itself reports it
                log(f"warm-up of batch {b} at context {c} failed: {exc}")
    cells = []
    for c in contexts:
        for b in batches:
            log(f"batch {b} at context {c}")
            cells.append(measure_cell(engine, step_bytes, b, c, decode_tokens, bandwidth_gbs, rng))
    return cells
