"""KV-cache sizing: how many blocks fit, and the longest sequence the engine accepts.

Hybrid models (layers with a :class:`RecurrentStateSpec`) also get fixed recurrent-state rows:
one live slot per running sequence plus the prefix snapshots; their bytes come off the budget
before the KV blocks are counted.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from atlas_core.engine.window_blocks import WindowPool, is_windowed, plan_window_pool
from atlas_core.interfaces.layer import KVCacheSpec, RecurrentStateSpec
from atlas_core.ops._dtypes import as_dtype, bfloat16, float8_e4m3fn

log = logging.getLogger(__name__)

_MIB = 1 << 20
_GIB = 1 << 30
#: On unified memory (GB10 / DGX Spark) the KV cache never takes the last of this much RAM,
#: whatever --gpu-memory-utilization says: the OS, the server process and page cache live there
#: (the original engine's users hit host OOM and wedged machines).
UNIFIED_SYSTEM_RESERVE = 4 * _GIB
UNIFIED_SYSTEM_FRACTION = 0.05


def system_reserve(total: int) -> int:
    """Bytes of unified memory left to the system: at least 4 GiB or 5% of it."""
    return max(UNIFIED_SYSTEM_RESERVE, int(total * UNIFIED_SYSTEM_FRACTION))
#: CPU backends keep their KV pool small: their "device memory" is the host's RAM.
CPU_KV_LIMIT_BYTES = 2 << 30


@dataclass(frozen=True)
class KVCacheConfig:
    """The planned KV pool.

    Attributes:
        num_blocks: blocks per layer pool.
        block_size: tokens per block.
        dtype: storage dtype of K and V.
        bytes_per_block: bytes one block takes across every layer (K and V).
        max_seq_len: longest prompt + output the engine accepts.
        num_state_slots: recurrent-state slots for running sequences (0: no recurrent layers).
        num_state_snapshots: recurrent-state rows for prefix snapshots.
        state_bytes_per_slot: bytes one slot (or snapshot) takes across every recurrent layer.
        num_spec_state_rows: recurrent-state rows after the snapshots for speculative
            verification (per-position state candidates, :mod:`atlas_core.engine.spec`).
        window_pool: the sliding-window layers' own pool (:mod:`atlas_core.engine.window_blocks`;
            ``bytes_per_block`` then counts the other layers only), or None.
    """

    num_blocks: int
    block_size: int
    dtype: np.dtype
    bytes_per_block: int
    max_seq_len: int
    num_state_slots: int = 0
    num_state_snapshots: int = 0
    state_bytes_per_slot: int = 0
    num_spec_state_rows: int = 0
    window_pool: WindowPool | None = None

    @property
    def num_state_rows(self) -> int:
        """Rows of every recurrent-state pool: live slots, snapshots, then speculation rows."""
        return self.num_state_slots + self.num_state_snapshots + self.num_spec_state_rows


def kv_cache_dtype(name: str, model_dtype: Any) -> np.dtype:
    """``auto`` -> the model's dtype; ``bf16`` -> bfloat16; ``fp8`` -> float8_e4m3fn storage."""
    if name == "auto":
        return as_dtype(model_dtype)
    if name in ("bf16", "bfloat16"):
        return bfloat16
    if name in ("fp8", "fp8_e4m3", "float8_e4m3fn"):
        return float8_e4m3fn
    raise ValueError(f"kv_cache_dtype must be auto, bf16 or fp8, got {name!r}")


def kv_specs(model: Any) -> list[KVCacheSpec | RecurrentStateSpec | None]:
    """The model's per-layer state specs (paged KV, recurrent state, or ``None``)."""
    specs = list(model.kv_cache_specs())
    for spec in specs:
        if spec is not None and not isinstance(spec, (KVCacheSpec, RecurrentStateSpec)):
            raise ValueError(f"unsupported layer state {spec!r}: the engine knows KVCacheSpec "
                             "and RecurrentStateSpec")
    return specs


def bytes_per_block(specs: list, block_size: int, dtype: np.dtype) -> int:
    return max(1, kv_bytes_per_token(specs, dtype) * block_size)


def kv_bytes_per_token(specs: list, dtype: np.dtype) -> int:
    """Paged-cache bytes one token takes across every layer (K and V, or an MLA latent)."""
    return sum(s.num_pools * s.num_kv_heads * s.head_dim for s in specs
               if isinstance(s, KVCacheSpec)) * np.dtype(dtype).itemsize


def state_bytes_per_slot(specs: list) -> int:
    """Bytes of one sequence's recurrent state across every recurrent layer (0: none)."""
    return sum(int(np.prod(shape)) * as_dtype(s.dtype).itemsize
               for s in specs if isinstance(s, RecurrentStateSpec) for shape in s.shapes.values())


def _state_rows(specs: list, args: Any) -> tuple[int, int, int]:
    # (slots, snapshots, bytes per row); snapshots only serve the prefix cache
    per_slot = state_bytes_per_slot(specs)
    if not per_slot:
        return 0, 0, 0
    snapshots = getattr(args, "num_state_snapshots", None)
    if snapshots is None:
        snapshots = args.max_num_seqs
    return args.max_num_seqs, snapshots if args.enable_prefix_caching else 0, per_slot


def _activation_reserve(model: Any, args: Any) -> int:
    num_tokens = args.max_prefill_tokens + args.max_batch_size
    hidden = int(getattr(model, "hidden_size", 0) or 0)
    vocab = int(getattr(model, "vocab_size", 0) or 0)
    specs = model.kv_cache_specs() if hasattr(model, "kv_cache_specs") else []
    layer_work = max((getattr(s, "prefill_bytes_per_token", 0) for s in specs if s), default=0)
    return (num_tokens * (hidden * 4 * 16 + layer_work) + args.max_batch_size * vocab * 4 * 4
            + 64 * _MIB)


def plan_kv_cache(backend: Any, model: Any, args: Any) -> KVCacheConfig:
    """Size the KV pool from free device memory, or check the explicit sizes asked for.

    Budget: ``total * gpu_memory_utilization - used_now - activation reserve`` where ``used_now``
    is at least the model's weights. Raises ``ValueError`` stating what fits when an explicit
    ``max_seq_len`` or ``num_kv_blocks`` does not.
    """
    dtype = kv_cache_dtype(args.kv_cache_dtype, model.dtype)
    specs = kv_specs(model)
    bs = args.block_size
    bpb = bytes_per_block(specs, bs, dtype)
    slots, snapshots, slot_bytes = _state_rows(specs, args)
    spec = getattr(args, "speculative_config", None)
    spec_rows = spec.state_rows if spec is not None and slot_bytes else 0
    free, total = backend.memory_info()
    used = max(total - free, int(getattr(model, "weights_nbytes", 0) or 0))
    reserve = _activation_reserve(model, args)
    budget = int(total * args.gpu_memory_utilization) - used - reserve
    unified = bool(getattr(backend.device_info(), "unified_memory", False))
    if unified:  # free is MemAvailable there: keep the system's share of it out of the budget
        budget = min(budget, free - system_reserve(total) - reserve)
    model_max = int(model.max_position_embeddings)
    want = min(args.max_seq_len or model_max, model_max)
    if backend.device_info().kind == "cpu":
        budget = min(budget, CPU_KV_LIMIT_BYTES)
    budget = _take_state_bytes(budget, slots, snapshots + spec_rows, slot_bytes)
    window = plan_window_pool(specs, args, bs, dtype, want, budget)
    if window is not None:
        bpb = bytes_per_block([s for s in specs if not is_windowed(s)], bs, dtype)
        budget -= window.num_blocks * window.bytes_per_block
    mem_blocks = max(0, budget // bpb)  # what memory allows; an explicit size is checked on this
    if backend.device_info().kind == "cpu" or not any(isinstance(s, KVCacheSpec) for s in specs):
        budget = min(budget, -(-want // bs) * args.max_num_seqs * bpb)
    fit_blocks = max(0, budget // bpb)

    def util_for(num_blocks: int) -> str:
        util = (used + reserve + num_blocks * bpb) / total + 0.005
        return f"--gpu-memory-utilization {util:.2f}" if util <= 1.0 else "a larger device"

    if args.num_kv_blocks is not None:
        if args.num_kv_blocks > mem_blocks:
            raise ValueError(
                f"num_kv_blocks={args.num_kv_blocks} needs {args.num_kv_blocks * bpb / _MIB:.0f} MiB "
                f"but only {mem_blocks} blocks ({mem_blocks * bpb / _MIB:.0f} MiB) fit with "
                f"gpu_memory_utilization={args.gpu_memory_utilization}; use --num-kv-blocks "
                f"{mem_blocks} or {util_for(args.num_kv_blocks)}")
        num_blocks = args.num_kv_blocks
    else:
        num_blocks = fit_blocks
    if num_blocks < 1:
        raise ValueError(
            f"no memory left for the KV cache: {used / _MIB:.0f} MiB in use of {total / _MIB:.0f} "
            f"MiB with gpu_memory_utilization={args.gpu_memory_utilization}; use {util_for(16)} "
            "or a smaller model")
    max_seq_len = _max_seq_len(args, model_max, num_blocks, bs, bpb, util_for)
    log.info("KV cache: %d blocks of %d tokens (%s, %.1f MiB, %d bytes per token), "
             "max_seq_len %d", num_blocks, bs, np.dtype(dtype).name, num_blocks * bpb / _MIB,
             bpb // bs, max_seq_len)
    if unified:
        log.info("unified memory: sized from /proc/meminfo MemAvailable (%.1f GiB free before the "
                 "KV cache), %.1f GiB kept for the system", free / _GIB,
                 system_reserve(total) / _GIB)
    if slot_bytes:
        log.info("recurrent state: %d slots + %d prefix snapshots of %.1f MiB (%.1f MiB)", slots,
                 snapshots, slot_bytes / _MIB, (slots + snapshots) * slot_bytes / _MIB)
    if window is not None:
        log.info("sliding-window KV pool: %d blocks (%.1f MiB) for a window of %d tokens",
                 window.num_blocks, window.num_blocks * window.bytes_per_block / _MIB,
                 window.window)
    return KVCacheConfig(num_blocks, bs, np.dtype(dtype), bpb, max_seq_len, slots, snapshots,
                         slot_bytes, spec_rows, window_pool=window)


def _take_state_bytes(budget: int, slots: int, snapshots: int, slot_bytes: int) -> int:
    """The budget left for KV blocks once the recurrent-state rows are set aside."""
    need = (slots + snapshots) * slot_bytes
    if need and need > budget:
        raise ValueError(
            f"recurrent state for {slots} sequences + {snapshots} prefix snapshots needs "
            f"{need / _MIB:.0f} MiB ({slot_bytes / _MIB:.1f} MiB each) but only "
            f"{max(budget, 0) / _MIB:.0f} MiB are left; lower --max-num-seqs or "
            "num_state_snapshots, or raise --gpu-memory-utilization")
    return budget - need


def _max_seq_len(args: Any, model_max: int, num_blocks: int, bs: int, bpb: int, util_for) -> int:
    fit_len = num_blocks * bs
    if args.max_seq_len is None:
        return min(model_max, fit_len)
    if args.max_seq_len > model_max:
        raise ValueError(f"max_seq_len={args.max_seq_len} exceeds the model's "
                         f"max_position_embeddings ({model_max}); use --max-seq-len {model_max} or less")
    if args.max_seq_len > fit_len:
        need = -(-args.max_seq_len // bs)
        hint = (f"use --max-seq-len {fit_len}" if args.num_kv_blocks is not None else
                f"use --max-seq-len {fit_len} or {util_for(need)}")
        raise ValueError(f"max_seq_len={args.max_seq_len} needs {need} KV blocks "
                         f"({need * bpb / _MIB:.0f} MiB) but only {num_blocks} blocks fit "
                         f"({num_blocks * bpb / _MIB:.0f} MiB); {hint}")
    return args.max_seq_len
