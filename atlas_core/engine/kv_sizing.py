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

from atlas_core.engine.kv_layers import (NVFP4_PREFILL_SCRATCH, describe_layer_dtypes, dtype_flag,
                                        kv_bytes_per_token, kv_cache_dtype, layer_kv_dtypes)
from atlas_core.engine.window_blocks import WindowPool, is_windowed, plan_window_pool
from atlas_core.interfaces.layer import KVCacheSpec, RecurrentStateSpec
from atlas_core.ops._dtypes import as_dtype

__all__ = ["KVCacheConfig", "bytes_per_block", "kv_bytes_per_token", "kv_cache_dtype",
           "kv_specs", "plan_kv_cache", "state_bytes_per_slot", "system_reserve"]

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
        dtype: storage dtype ``--kv-cache-dtype`` asked for (``uint8``: nvfp4 rows).
        bytes_per_block: bytes one block takes across every layer (K and V, each layer in its
            own dtype).
        max_seq_len: longest prompt + output the engine accepts.
        num_state_slots: recurrent-state slots for running sequences (0: no recurrent layers).
        num_state_snapshots: recurrent-state rows for prefix snapshots.
        state_bytes_per_slot: bytes one slot (or snapshot) takes across every recurrent layer.
        num_spec_state_rows: recurrent-state rows after the snapshots for speculative
            verification (per-position state candidates, :mod:`atlas_core.engine.spec`).
        window_pool: the sliding-window layers' own pool (:mod:`atlas_core.engine.window_blocks`;
            ``bytes_per_block`` then counts the other layers only), or None.
        layer_dtypes: each layer's KV storage dtype (None: no paged cache), as
            :func:`~atlas_core.engine.kv_layers.layer_kv_dtypes` chose with
            ``--kv-high-precision-layers``; empty: every layer in :attr:`dtype`.
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
    layer_dtypes: tuple = ()

    def layer_dtype(self, layer: int) -> np.dtype:
        """Storage dtype of layer ``layer``'s KV pools."""
        found = self.layer_dtypes[layer] if layer < len(self.layer_dtypes) else None
        return np.dtype(found) if found is not None else self.dtype

    @property
    def dtype_summary(self) -> str:
        """The KV dtype per layer group, e.g. ``nvfp4 (34 layers), bfloat16 (2 layers: 0, 35)``."""
        return (describe_layer_dtypes(list(self.layer_dtypes)) if self.layer_dtypes
                else dtype_flag(self.dtype))

    @property
    def num_state_rows(self) -> int:
        """Rows of every recurrent-state pool: live slots, snapshots, then speculation rows."""
        return self.num_state_slots + self.num_state_snapshots + self.num_spec_state_rows


def kv_specs(model: Any) -> list[KVCacheSpec | RecurrentStateSpec | None]:
    """The model's per-layer state specs (paged KV, recurrent state, or ``None``)."""
    specs = list(model.kv_cache_specs())
    for spec in specs:
        if spec is not None and not isinstance(spec, (KVCacheSpec, RecurrentStateSpec)):
            raise ValueError(f"unsupported layer state {spec!r}: the engine knows KVCacheSpec "
                             "and RecurrentStateSpec")
    return specs


def bytes_per_block(specs: list, block_size: int, dtype: Any) -> int:
    """Bytes of one block across ``specs`` (``dtype``: one dtype or one per spec)."""
    return max(1, kv_bytes_per_token(specs, dtype) * block_size)


def _layer_dtypes(backend: Any, model: Any, args: Any, specs: list) -> list:
    """Each layer's KV dtype, refused up front when the backend cannot read one of them."""
    dtypes = layer_kv_dtypes(specs, args.kv_cache_dtype, model.dtype,
                             getattr(args, "kv_high_precision_layers", "auto"),
                             getattr(model, "num_layers", None))
    supported = getattr(backend, "kv_cache_dtypes", frozenset({"bf16", "fp8"}))
    if "nvfp4" in {dtype_flag(d) for d in dtypes if d is not None} and "nvfp4" not in supported:
        raise ValueError(f"--kv-cache-dtype nvfp4: the {getattr(backend, 'name', 'chosen')} "
                         f"backend does not read nvfp4 KV caches (it takes: "
                         f"{', '.join(sorted(supported))})")
    return dtypes


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
    scratch = NVFP4_PREFILL_SCRATCH if getattr(args, "kv_cache_dtype", "") == "nvfp4" else 0
    return (num_tokens * (hidden * 4 * 16 + layer_work) + args.max_batch_size * vocab * 4 * 4
            + 64 * _MIB + scratch)


def plan_kv_cache(backend: Any, model: Any, args: Any) -> KVCacheConfig:
    """Size the KV pool from free device memory, or check the explicit sizes asked for.

    Budget: ``total * gpu_memory_utilization - used_now - activation reserve`` where ``used_now``
    is at least the model's weights. Raises ``ValueError`` stating what fits when an explicit
    ``max_seq_len`` or ``num_kv_blocks`` does not.
    """
    dtype = kv_cache_dtype(args.kv_cache_dtype, model.dtype)
    specs = kv_specs(model)
    dtypes = _layer_dtypes(backend, model, args, specs)
    bs = args.block_size
    bpb = bytes_per_block(specs, bs, dtypes)
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
    window = plan_window_pool(specs, args, bs, dtypes, want, budget)
    if window is not None:
        full = [i for i, s in enumerate(specs) if not is_windowed(s)]
        bpb = bytes_per_block([specs[i] for i in full], bs, [dtypes[i] for i in full])
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
    config = KVCacheConfig(num_blocks, bs, np.dtype(dtype), bpb, max_seq_len, slots, snapshots,
                           slot_bytes, spec_rows, window_pool=window, layer_dtypes=tuple(dtypes))
    log.info("KV cache: %d blocks of %d tokens (%.1f MiB, %d bytes per token), max_seq_len %d",
             num_blocks, bs, num_blocks * bpb / _MIB, bpb // bs, max_seq_len)
    log.info("kv cache: %s", config.dtype_summary)
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
    return config


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
