"""The quantized side of weight loading: which parameters stay quantized, their allocation, and
filling them from the checkpoint.

A parameter stays a :class:`~atlas_core.ops.quant.QuantizedWeight` when every checkpoint
tensor of its source group is quantized in one format that packs exactly
(:func:`~atlas_core.weights.quant_packing.decide_layout`), the parameter is
``quantizable`` (not an embedding table, not rewritten on the host by its module) and the
backend keeps that format (``backend.quantized_weight_formats``; ``atlas serve
--dequantize-weights`` empties it). Every other quantized tensor is dequantized exactly to the
model dtype at load, with one warning per reason.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from atlas_core.model.params import Module
from atlas_core.ops.quant import QuantizedWeight, dequantize
from atlas_core.weights.checkpoint import Checkpoint
from atlas_core.weights.quant_packing import PackedLayout, decide_layout, pack_sources
from atlas_core.weights.quant_tensors import (QuantTensor, fp8_scale_kind, read_quantized,
                                              scale_error)

log = logging.getLogger(__name__)

#: Parameters read by ops other than the weight-taking ones (``embedding``) stay plain.
PLAIN_SUFFIXES = ("embed_tokens.weight",)


def dequantize_all(backend: Any) -> None:
    """``--dequantize-weights``: ``backend`` keeps no quantized format, whatever its policy
    says when it binds a model, and not even where a checkpoint would fit the device only kept
    quantized (the size error says so instead)."""
    backend.quantized_weight_formats = frozenset()
    backend.dequantize_requested = True


def keeps_quantized_to_fit(backend: Any, need: int, kept: int, room: int, what: str) -> bool:
    """Whether ``backend`` now keeps quantized weights because, dequantized, they (``need``
    bytes) would not fit ``room`` while kept quantized (``kept``) they would; logs it. False
    when they fit either way, fit neither way, or the backend cannot keep them."""
    keep = getattr(backend, "keep_quantized", None)
    if (need <= room or kept > room or keep is None
            or getattr(backend, "dequantize_requested", False) or not keep()):
        return False
    gib = 2 ** 30
    log.warning("%s: dequantized the weights would need %.1f GiB, more than the %.1f GiB at hand; "
                "keeping them quantized (%.1f GiB)", what, need / gib, room / gib, kept / gib)
    return True


def quantized_formats(backend: Any) -> frozenset[str]:
    """The quantized formats ``backend``'s weight-taking ops accept
    (``backend.quantized_weight_formats``; none when the backend does not say)."""
    return frozenset(getattr(backend, "quantized_weight_formats", ()) or ())


@dataclass
class QuantPlan:
    """The quantized parameters of one load.

    Attributes:
        tensors: checkpoint data tensor name -> its :class:`QuantTensor`.
        companions: scale tensors (consumed with their weight, never loaded alone).
        layouts: ``(id(module), param)`` -> the layout it keeps.
        block_size: FP8 block shape of the checkpoint.
        scale_shapes: scale tensor name -> its shape.
        dequantized: reason -> parameters dequantized at load for it.
    """

    tensors: dict[str, QuantTensor]
    companions: set[str]
    block_size: tuple[int, int]
    scale_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    layouts: dict[tuple[int, str], PackedLayout] = field(default_factory=dict)
    dequantized: dict[str, list[str]] = field(default_factory=dict)

    def check_scales(self) -> None:
        """Fail before allocating when an FP8 scale fits no known layout.

        Raises:
            QuantizedTensorError: naming the scale, its shape and the layouts it could have.
        """
        for qt in self.tensors.values():
            shape = self.scale_shapes[qt.scale]
            if qt.kind == "fp8" and not fp8_scale_kind(shape, qt.shape, self.block_size):
                raise scale_error(qt, shape, self.block_size)

    def decide(self, checkpoint: Checkpoint, name: str, module: Module, param: str,
               sources: list[str], formats: frozenset[str]) -> None:
        """Record whether parameter ``name`` (filled by checkpoint ``sources``) stays quantized."""
        qts = [self.tensors.get(s) for s in sources]
        if all(qt is None for qt in qts):
            return
        spec = module.specs[param]
        packed, why = None, ""
        if not spec.quantizable or name.endswith(PLAIN_SUFFIXES):
            why = "the model reads them as plain arrays"
        else:
            packed, why = decide_layout(checkpoint, spec.shape, qts, self.block_size)
            if packed is not None and packed.format not in formats:
                why = f"the backend runs no {packed.format} weights"
                packed = None
        if packed is None:
            self.dequantized.setdefault(why, []).append(name)
        else:
            self.layouts[(id(module), param)] = packed

    def allocate(self, module: Module, param: str) -> QuantizedWeight | None:
        """``Module.materialize``'s ``allocate``: device arrays of a kept quantized parameter."""
        packed = self.layouts.get((id(module), param))
        if packed is None:
            return None
        arrays = {k: None if v is None else module.backend.empty(*v)
                  for k, v in packed.arrays().items()}
        return QuantizedWeight(packed.format, arrays["data"], arrays["scale"], packed.shape,
                               module.dtype, packed.block_size, arrays["global_scale"])

    def report(self) -> None:
        """Log the parameters dequantized at load, one warning per reason."""
        for why, names in self.dequantized.items():
            log.warning("dequantizing %d quantized parameters at load (%s), e.g. %s",
                        len(names), why, names[0])


def new_plan(checkpoint: Checkpoint, tensors: dict[str, QuantTensor], companions: set[str],
             block_size: tuple[int, int]) -> QuantPlan:
    """A :class:`QuantPlan` over the checkpoint's quantized tensors (scale shapes checked)."""
    plan = QuantPlan(tensors, companions, tuple(block_size),
                     {qt.scale: checkpoint.shape(qt.scale) for qt in tensors.values()})
    plan.check_scales()
    return plan


def read_dequantized(checkpoint: Checkpoint, qt: QuantTensor, dtype: np.dtype,
                     block_size: tuple[int, int]) -> np.ndarray:
    """One quantized checkpoint weight, dequantized exactly, as ``dtype``."""
    return dequantize(read_quantized(checkpoint, qt, dtype, block_size)).astype(dtype)


def fill_quantized(module: Module, param: str, checkpoint: Checkpoint, plan: QuantPlan,
                   sources: list[str]) -> int:
    """Copy a kept quantized parameter from its checkpoint ``sources``; returns bytes copied."""
    target = module.params[param]
    packed = plan.layouts[(id(module), param)]
    host = pack_sources(checkpoint, packed, [plan.tensors[s] for s in sources], module.dtype,
                        plan.block_size)
    backend = module.backend
    for part in ("data", "scale", "global_scale"):
        dst, src = getattr(target, part), getattr(host, part)
        if dst is not None:
            backend.copy_from_host(dst, np.asarray(src, order="C"))
    module.params[param] = target.replace(input_scale=host.input_scale)
    return host.nbytes


def weight_bytes(model: Module) -> Counter:
    """Bytes of every parameter of ``model`` by storage: ``"fp8_block"``, ``"nvfp4"``… for
    quantized weights, the dtype name (``"bfloat16"``) for plain arrays."""
    out: Counter = Counter()
    seen: set[int] = set()
    for module in model.modules():
        for array in module.params.values():
            if id(array) in seen:
                continue
            seen.add(id(array))
            key = array.format if isinstance(array, QuantizedWeight) else np.dtype(array.dtype).name
            out[key] += int(array.nbytes)
    return out


def _size(nbytes: int) -> str:
    return f"{nbytes / 2**30:,.2f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:,.2f} MiB"


def describe_weight_bytes(counts: Counter) -> str:
    """``"9.16 GiB (fp8_block 6.47 GiB, bfloat16 2.69 GiB)"`` for :func:`weight_bytes`."""
    parts = ", ".join(f"{k} {_size(v)}" for k, v in counts.most_common())
    return f"{_size(sum(counts.values()))} ({parts})"


def weights_line(model: Module) -> str:
    """The start-up line of ``atlas serve``: ``"weights: 3.21 GB (nvfp4 2.90 GB, …)"``."""
    return f"weights: {describe_weight_bytes(weight_bytes(model))}"
