"""Which checkpoint weights are quantized, read from the tensors present and their dtypes.

Exclusion lists (``modules_to_not_convert``, ``ignore``, ``exclude_modules``) are hints the
producers do not always keep (Qwen3.5 NVFP4 keeps ``mtp.fc`` in bf16 without listing it), so a
weight's format is decided here from its own tensors:

============================================ ========================================= =========
data tensor                                  companions                                format
============================================ ========================================= =========
``X.weight`` F8_E4M3                         ``X.weight_scale_inv`` or ``X.weight_scale``  fp8
                                             (scale shape says tensor / channel / block)
``X.weight`` U8 ``[.., N, K/2]``             ``X.weight_scale`` F8_E4M3 ``[.., N, K/16]``, nvfp4
                                             ``X.weight_scale_2`` (ModelOpt)
``X.weight_packed`` U8 ``[.., N, K/2]``      ``X.weight_scale`` F8_E4M3,                 nvfp4
                                             ``X.weight_global_scale`` (compressed-tensors,
                                             the inverse of ModelOpt's)
============================================ ========================================= =========

Fused expert tensors without a ``.weight`` suffix (``experts.gate_up_proj``) take their
companions by appending the same suffixes minus ``weight`` (``experts.gate_up_proj_scale``).
Activation scales (``X.input_scale``; compressed-tensors ``X.input_global_scale``, inverted)
are recorded, not needed: the weights run W8A16 / W4A16.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from atlas_core.ops._dtypes import float8_e4m3fn
from atlas_core.ops.quant import NVFP4_GROUP_SIZE, QuantizedWeight
from atlas_core.weights.checkpoint import Checkpoint
from atlas_core.weights.quantization import SUPPORTED, UnsupportedQuantizationError
from atlas_core.weights.safetensors_file import CheckpointError


class QuantizedTensorError(CheckpointError):
    """A quantized weight's companions are missing or have shapes that fit no known layout."""


@dataclass(frozen=True)
class QuantTensor:
    """One quantized checkpoint weight and the names of its companions.

    Attributes:
        name: the tensor holding the quantized values.
        key: the name the model declares (``X.weight`` for ``X.weight_packed``).
        kind: ``"fp8"`` or ``"nvfp4"``.
        shape: the logical (dequantized) shape.
        scale: the scale tensor.
        global_scale: nvfp4's second-level scale tensor.
        global_inverted: the global scale is stored as a divisor (compressed-tensors).
        input_scale: the static activation scale tensor, if any.
        input_inverted: ``input_scale`` is stored as a divisor.
    """

    name: str
    key: str
    kind: str
    shape: tuple[int, ...]
    scale: str
    global_scale: str | None = None
    global_inverted: bool = False
    input_scale: str | None = None
    input_inverted: bool = False

    @property
    def companions(self) -> tuple[str, ...]:
        """Every tensor besides :attr:`name` this weight uses."""
        return tuple(n for n in (self.scale, self.global_scale, self.input_scale) if n)


def _stem(name: str, suffix: str) -> str:
    return name[: -len(suffix)] if name.endswith(suffix) else name + "_"


def _first(checkpoint: Checkpoint, *names: str) -> str | None:
    return next((n for n in names if n in checkpoint), None)


def find_quantized(checkpoint: Checkpoint, name: str) -> QuantTensor | None:
    """How tensor ``name`` is quantized, or None when it is a plain (or companion) tensor.

    Raises:
        QuantizedTensorError: packed FP4 data without its block scales or global scale.
    """
    dtype, shape = checkpoint.dtype(name), checkpoint.shape(name)
    if name.endswith("weight_packed"):
        stem = _stem(name, "weight_packed")
        key = stem + "weight" if stem.endswith(".") else stem[:-1]
        return _nvfp4(checkpoint, name, key, stem + "weight_scale",
                      stem + "weight_global_scale", True, stem + "input_global_scale", True)
    stem = _stem(name, "weight")
    if dtype == float8_e4m3fn:
        scale = _first(checkpoint, name + "_scale_inv", name + "_scale")
        if scale is None or len(shape) < 2:
            return None
        return QuantTensor(name, name, "fp8", shape, scale,
                           input_scale=_first(checkpoint, stem + "input_scale"))
    scale = name + "_scale"
    if (dtype == np.uint8 and len(shape) >= 2 and scale in checkpoint
            and checkpoint.dtype(scale) == float8_e4m3fn):
        return _nvfp4(checkpoint, name, name, scale, name + "_scale_2", False,
                      stem + "input_scale", False)
    return None


def _nvfp4(checkpoint: Checkpoint, name: str, key: str, scale: str, global_scale: str,
           inverted: bool, input_scale: str, input_inverted: bool) -> QuantTensor:
    if checkpoint.dtype(name) != np.uint8:
        raise UnsupportedQuantizationError(
            f"the checkpoint is quantized as compressed-tensors packed {checkpoint.dtype(name)} "
            f"weights (tensor {name!r}), not NVFP4 (uint8, two E2M1 values a byte); Atlas "
            f"loads {SUPPORTED}")
    *lead, n, half = checkpoint.shape(name)
    shape = (*lead, n, 2 * half)
    for need in (scale, global_scale):
        if need not in checkpoint:
            raise QuantizedTensorError(f"NVFP4 weight {name} has no {need} in the checkpoint "
                                       "(the download is incomplete or the export is broken)")
    want = (*lead, n, 2 * half // NVFP4_GROUP_SIZE)
    if checkpoint.shape(scale) != want or checkpoint.dtype(scale) != float8_e4m3fn:
        raise QuantizedTensorError(
            f"{scale} is {checkpoint.dtype(scale)} {list(checkpoint.shape(scale))}; NVFP4 block "
            f"scales of {name} {list(shape)} are float8_e4m3fn {list(want)} (groups of "
            f"{NVFP4_GROUP_SIZE}); other group sizes are not supported")
    return QuantTensor(name, key, "nvfp4", shape, scale, global_scale, inverted,
                       input_scale if input_scale in checkpoint else None, input_inverted)


def scan_checkpoint(checkpoint: Checkpoint) -> tuple[dict[str, QuantTensor], set[str]]:
    """``({data tensor name: QuantTensor}, companion names)`` over the whole checkpoint."""
    found, companions = {}, set()
    for name in checkpoint.names():
        qt = find_quantized(checkpoint, name)
        if qt is not None:
            found[name] = qt
            companions.update(qt.companions)
    return found, companions


def fp8_scale_kind(scale_shape: tuple[int, ...], shape: tuple[int, ...],
                   block_size: tuple[int, int]) -> str:
    """``"fp8_tensor"``, ``"fp8_channel"`` or ``"fp8_block"`` for an FP8 scale of
    ``scale_shape`` over a weight of ``shape`` (``[*L, N, K]``); ``""`` for no known layout."""
    *lead, n, k = shape
    lead = tuple(lead)
    size = int(np.prod(scale_shape, dtype=np.int64))
    if size == int(np.prod(lead, dtype=np.int64)) and scale_shape in (
            lead, (*lead, 1), (*lead, 1, 1)) or (not lead and size == 1):
        return "fp8_tensor"
    if scale_shape in ((*lead, n), (*lead, n, 1)):
        return "fp8_channel"
    bn, bk = block_size
    if scale_shape == (*lead, -(-n // bn), -(-k // bk)):
        return "fp8_block"
    return ""


def scale_error(qt: QuantTensor, shape: tuple[int, ...], block_size: tuple[int, int]
                ) -> QuantizedTensorError:
    """The error for an FP8 scale of ``shape`` that fits no layout of ``qt``'s weight."""
    *lead, n, k = qt.shape
    bn, bk = block_size
    return QuantizedTensorError(
        f"{qt.scale} has shape {list(shape)} for a weight of shape {list(qt.shape)}: neither "
        f"per-tensor [1], per-channel {[*lead, n, 1]} nor {bn}x{bk} blocks "
        f"{[*lead, -(-n // bn), -(-k // bk)]}; if the blocks differ, set "
        "quantization_config.weight_block_size")


def _as_f32(array: np.ndarray) -> np.ndarray:
    return np.asarray(array).astype(np.float32)


def _scalar(checkpoint: Checkpoint, name: str | None, inverted: bool, lead: tuple[int, ...]
            ) -> np.ndarray | None:
    if name is None:
        return None
    value = _as_f32(checkpoint.get(name))
    if value.size == 1:
        value = np.full(lead, value.reshape(()), np.float32)
    value = value.reshape(lead)
    return (np.float32(1.0) / value).astype(np.float32) if inverted else value


def read_quantized(checkpoint: Checkpoint, qt: QuantTensor, dtype: np.dtype,
                   block_size: tuple[int, int]) -> QuantizedWeight:
    """One checkpoint weight as a host :class:`QuantizedWeight` (views of the mmap where the
    layout already matches; scales converted to float32, ue8m0 included).

    Raises:
        QuantizedTensorError: an FP8 scale whose shape is neither per-tensor, per-channel nor
            ``block_size`` blocks.
    """
    lead = tuple(qt.shape[:-2])
    data = checkpoint.get(qt.name)
    input_scale = _scalar(checkpoint, qt.input_scale, qt.input_inverted, ())
    input_scale = None if input_scale is None else float(input_scale.reshape(-1)[0])
    if qt.kind == "nvfp4":
        global_scale = _scalar(checkpoint, qt.global_scale, qt.global_inverted, lead)
        return QuantizedWeight("nvfp4", data, checkpoint.get(qt.scale), qt.shape, dtype,
                               global_scale=global_scale, input_scale=input_scale)
    scale = _as_f32(checkpoint.get(qt.scale))
    fmt = fp8_scale_kind(scale.shape, qt.shape, block_size)
    if not fmt:
        raise scale_error(qt, scale.shape, block_size)
    if fmt == "fp8_tensor":
        scale = scale.reshape(lead) if lead else scale.reshape(())
    elif fmt == "fp8_channel":
        scale = scale.reshape(*lead, qt.shape[-2])
    return QuantizedWeight(fmt, data, scale, qt.shape, dtype,
                           block_size=block_size if fmt == "fp8_block" else None,
                           input_scale=input_scale)
