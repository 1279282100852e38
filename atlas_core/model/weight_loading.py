"""Fill a materialised :class:`~atlas_core.model.params.Module` tree from a checkpoint.

Every parameter declares the checkpoint tensors that fill it (see :mod:`atlas_core.model.params`).
Loading first plans the whole model from the safetensors headers alone, so a missing or
mis-shaped tensor is reported by name before any data is read, then streams each tensor from the
mmap into its slice of the device parameter.

fp8 checkpoints: an ``F8_E4M3`` weight with a ``<name>_scale_inv`` block-scale tensor (the
DeepSeek / Qwen FP8 layout, blocks of ``quantization_config.weight_block_size``, default
128 x 128) or a ``<name>_scale`` tensor is dequantised on the host to the model dtype at load.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from atlas_core.model.params import Module
from atlas_core.ops._dtypes import float8_e4m3fn
from atlas_core.weights.checkpoint import Checkpoint

log = logging.getLogger(__name__)

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
                targets[prefix + s.name] = _Target(module, local, group, offset, s.shape)
                offset += math.prod(s.shape)
    return targets


def _canonical(name: str, targets: dict[str, _Target]) -> str:
    if name in targets:
        return name
    for old, new in WRAPPER_PREFIXES:
        if name.startswith(old) and new + name[len(old):] in targets:
            return new + name[len(old):]
    return name


def plan_weights(model: Module, checkpoint: Checkpoint) -> list[tuple[str, _Target]]:
    """Match checkpoint tensors to parameters from the headers only.

    Returns:
        ``(checkpoint_name, target)`` pairs to copy.

    Raises:
        WeightLoadError: a tensor has the wrong shape, or a parameter's tensors are missing.
    """
    targets = _targets(model)
    plan, loaded, unused = [], {}, []
    for name in checkpoint.names():
        key = _canonical(name, targets)
        target = targets.get(key)
        if target is None:
            unused.append(name)
            continue
        found = checkpoint.shape(name)
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
    return plan


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


def read_tensor(checkpoint: Checkpoint, name: str, dtype: np.dtype,
                block_size: tuple[int, int] = (128, 128)) -> np.ndarray:
    """Host copy-or-view of tensor ``name`` as ``dtype``, dequantising fp8 weights with scales."""
    array = checkpoint.get(name)
    has_scale = name + "_scale_inv" in checkpoint or name + "_scale" in checkpoint
    if array.dtype == float8_e4m3fn and dtype != array.dtype and has_scale:
        return _dequantize(checkpoint, name, array, block_size).astype(dtype)
    return array if array.dtype == dtype else array.astype(dtype)


def _dequantize(checkpoint: Checkpoint, name: str, weight: np.ndarray,
                block_size: tuple[int, int]) -> np.ndarray:
    w = weight.astype(np.float32)
    if name + "_scale_inv" in checkpoint:
        scale = checkpoint.get(name + "_scale_inv").astype(np.float32)
    else:
        scale = checkpoint.get(name + "_scale").astype(np.float32)
    if scale.ndim == 2 and w.ndim == 2 and scale.shape != w.shape and scale.size > 1:
        bo, bi = block_size
        scale = np.repeat(np.repeat(scale, bo, axis=0), bi, axis=1)[: w.shape[0], : w.shape[1]]
    return w * scale


def load_weights(model: Module, checkpoint: Checkpoint, config: dict[str, Any] | None = None,
                 plan: list[tuple[str, _Target]] | None = None) -> None:
    """Copy every checkpoint tensor into its (materialised) parameter slice.

    Args:
        model: the materialised model tree.
        checkpoint: tensor source.
        config: config.json (for ``quantization_config.weight_block_size``).
        plan: from :func:`plan_weights`, when the caller validated before allocating.

    Raises:
        WeightLoadError: see :func:`plan_weights`.
    """
    quant = (config or {}).get("quantization_config") or {}
    block_size = tuple(quant.get("weight_block_size") or (128, 128))
    for name, target in plan if plan is not None else plan_weights(model, checkpoint):
        param = target.module.params[target.param]
        host = read_tensor(checkpoint, name, param.dtype, block_size)
        size = host.size
        flat = param.reshape(math.prod(param.shape))
        target.module.backend.copy_from_host(flat[target.offset: target.offset + size],
                                             np.ascontiguousarray(host).reshape(size))
