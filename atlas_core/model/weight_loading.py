"""Fill a materialised :class:`~atlas_core.model.params.Module` tree from a checkpoint.

Every parameter declares the checkpoint tensors that fill it (see :mod:`atlas_core.model.params`).
Loading first plans the whole model from the safetensors headers alone, so a missing or
mis-shaped tensor is reported by name before any data is read, then streams each tensor from the
mmap into its slice of the device parameter.

Quantized checkpoints (FP8 block / tensor / channel, NVFP4 from ModelOpt or compressed-tensors):
each weight's format is read from its own tensors (:mod:`atlas_core.weights.quant_tensors`), its
scale tensors travel with it, and a parameter whose tensors are all quantized alike stays a
:class:`~atlas_core.ops.quant.QuantizedWeight` in device memory when the backend runs that
format (:mod:`atlas_core.model.quantized_loading`); anything else is dequantized exactly to the
model dtype at load. FP8 block shapes come from ``quantization_config`` (default 128 x 128).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from atlas_core.model.params import Module
from atlas_core.model.quantized_loading import (QuantPlan, fill_quantized, keeps_quantized_to_fit,
                                                new_plan, quantized_formats, read_dequantized)
from atlas_core.ops.quant import QuantizedWeight
from atlas_core.weights.checkpoint import Checkpoint
from atlas_core.weights.quant_tensors import (QuantizedTensorError, find_quantized,
                                              scan_checkpoint)

log = logging.getLogger(__name__)

#: Seconds between "loading weights: n/N tensors" log lines of a long load.
PROGRESS_INTERVAL_S = 5.0

#: Prefixes of multimodal wrappers whose text model is the one we load.
WRAPPER_PREFIXES = (("model.language_model.", "model."), ("language_model.model.", "model."),
                    ("language_model.lm_head.", "lm_head."))


class WeightLoadError(ValueError):
    """The checkpoint does not fit the model: a tensor is missing or has the wrong shape."""


@dataclass(frozen=True)
class _Target:
    module: Module
    param: str
    group: int
    offset: int
    shape: tuple[int, ...]
    full: str


class WeightPlan:
    """What :func:`load_weights` copies: ``(checkpoint_name, target)`` pairs (iterating the plan
    yields them) and the :class:`~atlas_core.model.quantized_loading.QuantPlan` saying which
    parameters stay quantized; pass :meth:`allocate` to ``Module.materialize``."""

    def __init__(self, entries: list[tuple[str, _Target]], quant: QuantPlan) -> None:
        self.entries, self.quant = entries, quant

    def __iter__(self):
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def allocate(self, module: Module, param: str) -> QuantizedWeight | None:
        """Storage of a parameter kept quantized (None: a plain array)."""
        return self.quant.allocate(module, param)


def checkpoint_tensors(model: Module) -> dict[str, tuple[int, ...]]:
    """HF tensor name -> shape of everything a model expects (first source alternative)."""
    out = {}
    for full, _, local, spec in model.named_specs():
        prefix = full[: len(full) - len(local)]
        out.update({prefix + s.name: s.shape for s in spec.sources[0]})
    return out


def _targets(model: Module) -> dict[str, _Target]:
    targets = {}
    for full, module, local, spec in model.named_specs():
        prefix = full[: len(full) - len(local)]
        for group, sources in enumerate(spec.sources):
            offset = 0
            for s in sources:
                targets[prefix + s.name] = _Target(module, local, group, offset, s.shape, full)
                offset += math.prod(s.shape)
    return targets


def _canonical(name: str, targets: dict[str, _Target]) -> str:
    if name in targets:
        return name
    for old, new in WRAPPER_PREFIXES:
        if name.startswith(old) and new + name[len(old):] in targets:
            return new + name[len(old):]
    return name


def plan_weights(model: Module, checkpoint: Checkpoint, config: dict[str, Any] | None = None,
                 formats: frozenset[str] = frozenset()) -> WeightPlan:
    """Match checkpoint tensors to parameters from the headers only (and the tiny NVFP4 global
    scales), deciding which parameters stay quantized.

    Args:
        model: the model tree (declared, not yet materialised).
        checkpoint: the tensors.
        config: config.json (FP8 block shape, see :func:`fp8_block_size`).
        formats: quantized formats the backend runs
            (:func:`~atlas_core.model.quantized_loading.quantized_formats`); other quantized
            weights are dequantized at load.

    Returns:
        The :class:`WeightPlan`.

    Raises:
        WeightLoadError: a tensor has the wrong shape, a parameter's tensors are missing, or a
            quantized weight's scales fit no known layout.
    """
    targets = _targets(model)
    tensors, companions = scan_checkpoint(checkpoint)
    try:
        quant = new_plan(checkpoint, tensors, companions, fp8_block_size(config))
    except QuantizedTensorError as exc:
        raise WeightLoadError(str(exc)) from None
    plan, loaded, unused = [], {}, []
    for name in checkpoint.names():
        if name in companions:
            continue
        qt = tensors.get(name)
        key = _canonical(qt.key if qt is not None else name, targets)
        target = targets.get(key)
        if target is None:
            unused.append(name)
            continue
        found = qt.shape if qt is not None else checkpoint.shape(name)
        if found != target.shape:
            raise WeightLoadError(
                f"tensor {name!r} in {checkpoint.file_of(name)} has shape {list(found)}, expected "
                f"{list(target.shape)} for this config: the checkpoint does not match config.json")
        plan.append((name, target))
        loaded.setdefault((id(target.module), target.param, target.group), set()).add(key)
    _check_complete(model, loaded)
    if unused:
        log.debug("ignoring %d checkpoint tensors the model does not use, e.g. %s", len(unused),
                  unused[:3])
    groups: dict[tuple[int, str, int], list[tuple[int, str, _Target]]] = {}
    for name, target in plan:
        groups.setdefault((id(target.module), target.param, target.group), []).append(
            (target.offset, name, target))
    for entries in groups.values():
        entries.sort(key=lambda e: e[0])
        target = entries[0][2]
        quant.decide(checkpoint, target.full, target.module, target.param,
                     [name for _, name, _ in entries], formats)
    quant.report()
    return WeightPlan(plan, quant)


def _check_complete(model: Module, loaded: dict) -> None:
    missing = []
    for full, module, local, spec in model.named_specs():
        prefix = full[: len(full) - len(local)]
        groups = [loaded.get((id(module), local, g), set()) for g in range(len(spec.sources))]
        if any(len(got) == len(spec.sources[g]) for g, got in enumerate(groups)):
            continue
        best = max(range(len(groups)), key=lambda g: len(groups[g]))
        missing += [(prefix + s.name, s.shape) for s in spec.sources[best]
                    if prefix + s.name not in groups[best]]
    if missing:
        listed = ", ".join(f"{n!r} (expected shape {list(s)})" for n, s in missing[:5])
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise WeightLoadError(f"checkpoint is missing tensor {listed}{more}: the checkpoint is "
                              "incomplete or was written for another architecture")


def parameter_count(module: Module) -> int:
    """Elements of every parameter declared in ``module``'s tree (nothing allocated)."""
    return sum(math.prod(spec.shape) for _, _, _, spec in module.named_specs())


def check_size(num_params: int, dtype: Any, checkpoint: Checkpoint, backend: Any) -> None:
    """Fail before anything is built when config.json describes a model that this checkpoint
    cannot hold or this device cannot fit (an absurd ``num_hidden_layers`` would otherwise
    build for minutes, then fail allocating).

    A quantized checkpoint (NVFP4: half a byte a parameter) kept quantized by the backend
    needs about its own size. One the backend would dequantize is kept quantized instead
    (``backend.keep_quantized()``, with a warning) when only that fits.

    Raises:
        WeightLoadError: naming the parameter count and the memory the weights would need.
    """
    quantized = bool(scan_checkpoint(checkpoint)[0])
    kept = quantized and bool(quantized_formats(backend))
    need = checkpoint.nbytes if kept else num_params * np.dtype(dtype).itemsize
    count = f"{num_params / 1e9:,.2f}B" if num_params >= 1e9 else f"{num_params / 1e6:,.2f}M"
    fields = "check num_hidden_layers, hidden_size, intermediate_size and vocab_size"

    def described() -> str:  # read when called: the check below may keep the weights packed
        return (f"config.json describes a model of {count} parameters, {_bytes(need)} of "
                f"{'quantized' if kept else np.dtype(dtype).name} weights")

    if num_params > (4 if quantized else 2) * checkpoint.nbytes:
        raise WeightLoadError(f"{described()}, but the checkpoint holds only "
                              f"{_bytes(checkpoint.nbytes)} of tensors: config.json does not "
                              f"match the checkpoint ({fields})")
    info = backend.device_info()
    unified = getattr(info, "unified_memory", False)
    if quantized and not kept:  # the backend would dequantize: keep them if only that fits
        room = info.total_memory
        if unified:
            from atlas_core.engine.kv_sizing import system_reserve
            room = min(room, backend.memory_info()[0] - system_reserve(info.total_memory))
        if keeps_quantized_to_fit(backend, need, checkpoint.nbytes, room,
                                  f"{info.name}, a {count}-parameter model"):
            kept, need = True, checkpoint.nbytes
    what = described()
    if need > info.total_memory:
        hint = getattr(backend, "keep_quantized_hint", "")
        if quantized and not kept and hint and checkpoint.nbytes <= info.total_memory:
            raise WeightLoadError(
                f"{what}, more than the {_bytes(info.total_memory)} of {info.name}: the "
                f"checkpoint is quantized ({_bytes(checkpoint.nbytes)}) but is being dequantized "
                f"at load; {hint} (and drop --dequantize-weights if given)")
        raise WeightLoadError(f"{what}, more than the {_bytes(info.total_memory)} of {info.name}: "
                              f"use a smaller model or a device with more memory ({fields} if "
                              "the model should fit)")
    if unified:
        from atlas_core.engine.kv_sizing import system_reserve
        free = backend.memory_info()[0]
        room = free - system_reserve(info.total_memory)
        if need > room:
            raise WeightLoadError(
                f"{what}, but {info.name} shares the host's memory and only {_bytes(free)} is "
                f"available now (/proc/meminfo MemAvailable), of which "
                f"{_bytes(system_reserve(info.total_memory))} stays with the system: close other "
                "programs (or other Atlas servers) or use a smaller or quantized checkpoint")


def _bytes(nbytes: int) -> str:
    return f"{nbytes / 2**30:,.1f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:,.2f} MiB"


def read_tensor(checkpoint: Checkpoint, name: str, dtype: np.dtype,
                block_size: tuple[int, int] = (128, 128)) -> np.ndarray:
    """Host copy-or-view of tensor ``name`` as ``dtype``, dequantizing a quantized weight
    (FP8 with its scale, NVFP4 with its block and global scales) exactly.

    Raises:
        WeightLoadError: the weight's scales fit no known layout.
    """
    try:
        qt = find_quantized(checkpoint, name)
        if qt is not None and np.dtype(dtype) != checkpoint.dtype(name):
            return read_dequantized(checkpoint, qt, np.dtype(dtype), tuple(block_size))
    except QuantizedTensorError as exc:
        raise WeightLoadError(str(exc)) from None
    array = checkpoint.get(name)
    return array if array.dtype == dtype else array.astype(dtype)


def fp8_block_size(config: dict[str, Any] | None) -> tuple[int, int]:
    """Block shape of FP8 block scales: ``quantization_config.weight_block_size`` or a
    compressed-tensors group's ``weights.block_structure`` (default 128 x 128)."""
    quant = (config or {}).get("quantization_config") or {}
    if quant.get("weight_block_size"):
        return tuple(quant["weight_block_size"])
    for group in (quant.get("config_groups") or {}).values():
        block = ((group or {}).get("weights") or {}).get("block_structure")
        if block:
            return tuple(block)
    return (128, 128)


def load_weights(model: Module, checkpoint: Checkpoint, config: dict[str, Any] | None = None,
                 plan: WeightPlan | None = None) -> None:
    """Copy every checkpoint tensor into its (materialised) parameter slice; parameters
    materialised as :class:`~atlas_core.ops.quant.QuantizedWeight` get their data and scales.
    Then every module's :meth:`~atlas_core.model.params.Module.post_load` runs once, parents
    before children.

    Args:
        model: the materialised model tree.
        checkpoint: tensor source.
        config: config.json (for the FP8 block shape, see :func:`fp8_block_size`).
        plan: from :func:`plan_weights`, when the caller validated before allocating.

    Raises:
        WeightLoadError: see :func:`plan_weights`.
    """
    plan = plan if plan is not None else plan_weights(model, checkpoint, config)
    quant = plan.quant
    start = last_report = time.perf_counter()
    num_bytes, kept = 0, {}
    for done, (name, target) in enumerate(plan, 1):
        param = target.module.params[target.param]
        if isinstance(param, QuantizedWeight):
            kept.setdefault((id(target.module), target.param), (target.module, []))[1].append(
                (target.offset, name))
            continue
        qt = quant.tensors.get(name)
        host = (read_dequantized(checkpoint, qt, param.dtype, quant.block_size) if qt is not None
                else read_tensor(checkpoint, name, param.dtype))
        size = host.size
        flat = param.reshape(math.prod(param.shape))
        target.module.backend.copy_from_host(flat[target.offset: target.offset + size],
                                             np.ascontiguousarray(host).reshape(size))
        num_bytes += host.nbytes
        if time.perf_counter() - last_report >= PROGRESS_INTERVAL_S and done < len(plan):
            last_report = time.perf_counter()
            log.info("loading weights: %d/%d tensors (%d%%), %.2f GB, %.1f s", done, len(plan),
                     100 * done // len(plan), num_bytes / 1e9, last_report - start)
    for (_, param), (module, sources) in kept.items():
        num_bytes += fill_quantized(module, param, checkpoint, quant,
                                    [name for _, name in sorted(sources)])
    for module in model.modules():
        module.post_load()
    log.info("loaded %d weight tensors (%.2f GB) in %.1f s", len(plan), num_bytes / 1e9,
             time.perf_counter() - start)
