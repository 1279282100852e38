"""Which quantized format a checkpoint is in, and one clear error for formats Atlas cannot load.

Atlas loads unquantized checkpoints, FP8 ones (per-tensor, per-channel or block scales: Qwen /
DeepSeek ``quant_method: fp8``, ModelOpt ``FP8``, compressed-tensors float8) and NVFP4 ones
(ModelOpt ``NVFP4`` / ``MIXED_PRECISION`` of FP8 and NVFP4 layers, compressed-tensors
``nvfp4-pack-quantized``), kept quantized where the backend runs them (see
:mod:`atlas_core.weights.quant_tensors`). Everything else is named by what it is, from
``config.json``'s ``quantization_config`` (``quant_method``, ModelOpt's ``quant_algo`` and
``quantized_layers``, compressed-tensors' ``config_groups``), ModelOpt's
``hf_quant_config.json``, or tensor names the format leaves behind (``qweight``, ``qzeros``,
``_blocks``...), rather than failing later with a shape mismatch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

from atlas_core.weights.safetensors_file import CheckpointError

#: ``quant_method`` values Atlas loads (FP8 weights with scales).
FP8_METHODS = {"fp8", "fbgemm_fp8"}

#: ModelOpt ``quant_algo`` values Atlas loads (``MIXED_PRECISION``: when every layer is one of
#: the others).
MODELOPT_ALGOS = {"fp8", "nvfp4", "fp8_pb_wo", "fp8_per_channel_per_token", "mixed_precision"}

#: ``quant_method`` / ``quant_algo`` (lower case) -> the format's usual name.
FORMAT_NAMES = {"awq": "AWQ", "gptq": "GPTQ", "mxfp4": "MXFP4", "bitsandbytes": "bitsandbytes",
                "gguf": "GGUF", "nvfp4": "NVFP4", "w4a8_awq": "W4A8-AWQ", "int4_awq": "INT4-AWQ",
                "w4a16_awq": "INT4-AWQ", "int8_sq": "INT8 SmoothQuant", "hqq": "HQQ",
                "aqlm": "AQLM", "quanto": "Quanto", "eetq": "EETQ", "torchao": "torchao",
                "exl2": "EXL2", "auto-round": "AutoRound", "bitnet": "BitNet"}

#: Tensor-name suffix -> the format that writes it (checked when the config says nothing).
TENSOR_MARKS = ((".qweight", "GPTQ/AWQ"),
                (".qzeros", "GPTQ/AWQ"), (".g_idx", "GPTQ"), ("_blocks", "MXFP4"),
                (".SCB", "bitsandbytes int8"), (".absmax", "bitsandbytes 4-bit"),
                (".quant_map", "bitsandbytes 4-bit"))

SUPPORTED = ("unquantized (bf16 / fp16 / fp32), FP8 (per-tensor, per-channel or block scales; "
             "Qwen / DeepSeek fp8, ModelOpt FP8, compressed-tensors float8) and NVFP4 (ModelOpt "
             "NVFP4 or MIXED_PRECISION, compressed-tensors nvfp4-pack-quantized) checkpoints")


class UnsupportedQuantizationError(CheckpointError):
    """The checkpoint is quantized in a format Atlas cannot load yet."""


def _compressed_tensors_format(quant: dict[str, Any]) -> str | None:
    """None for FP8 or NVFP4 weights, else a name for the compressed-tensors scheme."""
    fmt = str(quant.get("format") or "")
    for group in (quant.get("config_groups") or {}).values():
        weights = (group or {}).get("weights") or {}
        bits, kind = weights.get("num_bits"), weights.get("type")
        if (bits, kind) == (8, "float"):
            continue
        if (bits, kind) == (4, "float") and weights.get("group_size") in (None, 16):
            continue
        if (bits, kind) == (4, "float"):
            return f"compressed-tensors fp4 with group_size {weights.get('group_size')} (MXFP4?)"
        return f"compressed-tensors {kind or 'int'}{bits or '?'} ({fmt or 'unknown format'})"
    return None


def _modelopt_algo(quant: dict[str, Any]) -> str | None:
    """None for a ModelOpt algorithm Atlas loads, else its name."""
    algo = str(quant.get("quant_algo") or "").lower()
    if algo == "mixed_precision":
        for layer in (quant.get("quantized_layers") or {}).values():
            found = _modelopt_algo(layer if isinstance(layer, dict) else {})
            if found is not None:
                return f"MIXED_PRECISION with {found} layers"
        return None
    return None if algo in ("", *MODELOPT_ALGOS) else FORMAT_NAMES.get(algo, algo.upper())


def config_format(quant: dict[str, Any]) -> str | None:
    """The unsupported format a ``quantization_config`` describes (None: none, or FP8)."""
    method = str(quant.get("quant_method") or "").lower()
    if not method or method in FP8_METHODS:
        return None
    if method == "compressed-tensors":
        return _compressed_tensors_format(quant)
    if method == "modelopt":
        return _modelopt_algo(quant)
    if method == "bitsandbytes":
        return "bitsandbytes 4-bit" if quant.get("load_in_4bit") else "bitsandbytes 8-bit"
    return FORMAT_NAMES.get(method, method)


def modelopt_format(model_dir: Path) -> str | None:
    """The unsupported format of ModelOpt's ``hf_quant_config.json`` (None: absent or FP8)."""
    path = model_dir / "hf_quant_config.json"
    try:
        quant = json.loads(path.read_text()).get("quantization", {})
        return _modelopt_algo(quant if isinstance(quant, dict) else {})
    except (OSError, ValueError, AttributeError):
        return None


def tensor_format(names: Iterable[str]) -> tuple[str, str] | None:
    """``(format, example tensor)`` when a tensor name betrays a quantized format."""
    for name in names:
        for suffix, fmt in TENSOR_MARKS:
            if name.endswith(suffix):
                return fmt, name
    return None


def check_supported(config: dict[str, Any], model_dir: str | Path,
                    tensor_names: Iterable[str]) -> None:
    """Raise when the checkpoint is quantized in a format Atlas does not load.

    Raises:
        UnsupportedQuantizationError: naming the format, where it was read and what to use.
    """
    quant = config.get("quantization_config")
    where = "config.json quantization_config"
    found = config_format(quant) if isinstance(quant, dict) else None
    if found is None:
        found, where = modelopt_format(Path(model_dir)), "hf_quant_config.json"
    if found is None:
        marked = tensor_format(tensor_names)
        if marked is not None:
            found, where = marked[0], f"tensor {marked[1]!r}"
    if found is not None:
        raise UnsupportedQuantizationError(
            f"{model_dir}: the checkpoint is quantized as {found} (from {where}); Atlas cannot "
            f"load {found} weights yet. It loads {SUPPORTED}: use the model's BF16, FP8 or "
            "NVFP4 release")
