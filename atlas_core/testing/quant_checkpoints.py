"""Tiny quantized checkpoints in the layouts real producers write, with their float reference.

``write_quantized_checkpoint("Qwen3ForCausalLM", tmp_path / "q", "nvfp4_modelopt")`` writes a
tiny model (:func:`~atlas_core.testing.checkpoints.write_tiny_checkpoint`) whose decoder
projections are quantized as the named scheme stores them, and, next to it with ``reference=``,
the same model in float32 holding exactly the dequantized weights (the parity target):

=========================== =================================================================
scheme                      tensors and config
=========================== =================================================================
``fp8_block``               Qwen / DeepSeek: ``weight`` F8_E4M3 + ``weight_scale_inv`` F32
                            blocks; ``quant_method: fp8``, ``weight_block_size``
``fp8_block_ue8m0``         the same with power-of-two scales (DeepSeek ``scale_fmt: ue8m0``)
``fp8_tensor_modelopt``     ModelOpt FP8: scalar ``weight_scale`` + ``input_scale``;
                            ``hf_quant_config.json`` and ``quant_method: modelopt``
``fp8_channel_ct``          compressed-tensors float8, ``weight_scale`` ``[N, 1]``
``nvfp4_modelopt``          ModelOpt NVFP4: ``weight`` U8 ``[N, K/2]``, ``weight_scale`` F8
                            ``[N, K/16]``, ``weight_scale_2`` + ``input_scale`` scalars
``nvfp4_ct``                compressed-tensors ``nvfp4-pack-quantized``: ``weight_packed``,
                            ``weight_scale``, ``weight_global_scale`` and
                            ``input_global_scale`` (inverted)
=========================== =================================================================

Fused projections share their NVFP4 global scale (q/k/v, each expert's gate/up, a Gated
DeltaNet's ``in_proj_*``), as ModelOpt and llm-compressor export them.
``fused_experts=True`` stores MoE experts as stacked ``experts.gate_up_proj`` /
``experts.down_proj`` tensors (companions ``<name>_scale`` …).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from atlas_core.ops._dtypes import bfloat16
from atlas_core.ops.quant import QuantizedWeight, dequantize, fp8_codes, quantize
from atlas_core.plugins import Registry
from atlas_core.testing.checkpoints import write_tiny_checkpoint
from atlas_core.weights.checkpoint import Checkpoint
from atlas_core.weights.safetensors_file import write_safetensors

SCHEMES = ("fp8_block", "fp8_block_ue8m0", "fp8_tensor_modelopt", "fp8_channel_ct",
           "nvfp4_modelopt", "nvfp4_ct")

#: scheme -> the QuantizedWeight format its tensors quantize to.
SCHEME_FORMATS = {"fp8_block": "fp8_block", "fp8_block_ue8m0": "fp8_block",
                  "fp8_tensor_modelopt": "fp8_tensor", "fp8_channel_ct": "fp8_channel",
                  "nvfp4_modelopt": "nvfp4", "nvfp4_ct": "nvfp4"}

_QUANTIZED = re.compile(r"\.layers\.\d+\..*(_proj(_\w+)?\.weight|experts\.(gate_up|down)_proj)$")
_FUSED = re.compile(r"^(.*\.)(q|k|v|gate|up|in)_proj(_\w+)?\.weight$")


def _fusion_key(name: str) -> str:
    m = _FUSED.match(name)
    if m is None:
        return name
    return m.group(1) + {"q": "qkv", "k": "qkv", "v": "qkv", "in": "in_proj"}.get(m.group(2),
                                                                               "gate_up")


def _fuse_experts(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    prefixes = sorted({n[: n.index("experts.") + 8] for n in tensors if ".experts.0." in n})
    for p in prefixes:
        count = sum(1 for n in tensors if n.startswith(p) and n.endswith(".down_proj.weight"))
        gu = [np.concatenate([tensors.pop(f"{p}{e}.gate_proj.weight"),
                              tensors.pop(f"{p}{e}.up_proj.weight")]) for e in range(count)]
        down = [tensors.pop(f"{p}{e}.down_proj.weight") for e in range(count)]
        tensors[p + "gate_up_proj"], tensors[p + "down_proj"] = np.stack(gu), np.stack(down)
    return tensors


def _quantize_groups(tensors: dict[str, np.ndarray], fmt: str, block_size: tuple[int, int],
                     ue8m0: bool) -> dict[str, QuantizedWeight]:
    groups: dict[str, list[str]] = {}
    for name in tensors:
        if _QUANTIZED.search(name):
            groups.setdefault(_fusion_key(name), []).append(name)
    out = {}
    for names in groups.values():
        if fmt != "nvfp4":
            for n in names:
                out[n] = (_power_of_two(tensors[n], block_size) if ue8m0
                          else quantize(tensors[n], fmt, block_size=block_size))
            continue
        whole = quantize(np.concatenate([tensors[n] for n in names], axis=-2), fmt)
        start = 0
        for n in names:
            rows = tensors[n].shape[-2]
            out[n] = QuantizedWeight(fmt, whole.data[..., start:start + rows, :],
                                     whole.scale[..., start:start + rows, :], tensors[n].shape,
                                     np.float32, global_scale=whole.global_scale)
            start += rows
    return out


def _power_of_two(w: np.ndarray, block_size: tuple[int, int]) -> QuantizedWeight:
    bn, bk = block_size
    scale = np.exp2(np.ceil(np.log2(quantize(w, "fp8_block", block_size=block_size).scale)))
    n, k = w.shape[-2:]
    full = np.repeat(np.repeat(scale, bn, -2), bk, -1)[..., :n, :k]
    return QuantizedWeight("fp8_block", fp8_codes(w / full), scale.astype(np.float32), w.shape,
                           np.float32, block_size=block_size)


def _hf_tensors(name: str, qw: QuantizedWeight, scheme: str) -> dict[str, np.ndarray]:
    stem = name[: -len("weight")] if name.endswith("weight") else name + "_"
    scale_suffix = "weight_scale" if name.endswith("weight") else "scale"
    if scheme in ("fp8_block", "fp8_block_ue8m0"):
        return {name: qw.data, name + "_scale_inv": qw.scale}
    if scheme == "fp8_tensor_modelopt":
        return {name: qw.data, stem + scale_suffix: np.asarray(qw.scale, np.float32),
                stem + "input_scale": np.float32(0.02).reshape(())}
    if scheme == "fp8_channel_ct":
        return {name: qw.data, stem + scale_suffix: qw.scale[..., None]}
    g = np.asarray(qw.global_scale, np.float32)
    if scheme == "nvfp4_modelopt":
        return {name: qw.data, stem + scale_suffix: qw.scale,
                stem + scale_suffix + "_2": g.reshape(g.shape or ()),
                stem + "input_scale": np.float32(0.02).reshape(())}
    return {stem + "weight_packed": qw.data, stem + "weight_scale": qw.scale,
            stem + "weight_global_scale": (1.0 / g).reshape(g.shape or (1,)).astype(np.float32),
            stem + "input_global_scale": np.full((1,), 50.0, np.float32)}


def _quant_config(scheme: str, block_size: tuple[int, int]) -> tuple[dict, dict | None]:
    ignore = ["lm_head"]
    if scheme.startswith("fp8_block"):
        config = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                  "weight_block_size": list(block_size), "modules_to_not_convert": ignore}
        return ({**config, "scale_fmt": "ue8m0"} if scheme.endswith("ue8m0") else config), None
    if scheme.endswith("_modelopt"):
        algo = "FP8" if scheme.startswith("fp8") else "NVFP4"
        extra = {"group_size": 16} if algo == "NVFP4" else {}
        hf = {"producer": {"name": "modelopt", "version": "0.37.0"},
              "quantization": {"quant_algo": algo, "kv_cache_quant_algo": None,
                               "exclude_modules": ignore, **extra}}
        return {"quant_method": "modelopt", "quant_algo": algo, "ignore": ignore, **extra}, hf
    weights = ({"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True}
               if scheme == "fp8_channel_ct" else
               {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16,
                "symmetric": True})
    fmt = "float-quantized" if scheme == "fp8_channel_ct" else "nvfp4-pack-quantized"
    return {"quant_method": "compressed-tensors", "format": fmt, "ignore": ignore,
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights}}}, None


def write_quantized_checkpoint(architecture: str, path: str | os.PathLike, scheme: str, *,
                               reference: str | os.PathLike | None = None, seed: int = 0,
                               block_size: tuple[int, int] = (16, 16), fused_experts: bool = False,
                               registry: Registry | None = None, **config_overrides: Any) -> Path:
    """Write a tiny ``architecture`` model quantized as ``scheme`` (see :data:`SCHEMES`).

    Args:
        architecture: a registered architecture (``"Qwen3ForCausalLM"``, ``"Qwen3MoeForCausalLM"``).
        path: output directory.
        scheme: one of :data:`SCHEMES`.
        reference: also write the float32 model of the exact dequantized weights there.
        seed: weights seed.
        block_size: FP8 block shape (small, so tiny matrices hold several blocks).
        fused_experts: store MoE experts as stacked tensors.
        registry: plugin registry.
        **config_overrides: config.json fields.

    Returns:
        ``path``.
    """
    if scheme not in SCHEMES:
        raise ValueError(f"unknown scheme {scheme!r}; use one of {', '.join(SCHEMES)}")
    path = write_tiny_checkpoint(architecture, path, dtype="bfloat16", seed=seed,
                                 registry=registry, **config_overrides)
    ckpt = Checkpoint.open(path)
    tensors = {n: np.asarray(ckpt.get(n)).astype(np.float32) for n in ckpt.names()}
    del ckpt
    if fused_experts:
        tensors = _fuse_experts(tensors)
    quantized = _quantize_groups(tensors, SCHEME_FORMATS[scheme], block_size,
                                 scheme.endswith("ue8m0"))
    out = {}
    for name, value in tensors.items():
        out.update(_hf_tensors(name, quantized[name], scheme) if name in quantized
                   else {name: value.astype(bfloat16)})
    write_safetensors(path / "model.safetensors", out, {"format": "pt"})
    config = json.loads((path / "config.json").read_text())
    config["quantization_config"], hf = _quant_config(scheme, block_size)
    (path / "config.json").write_text(json.dumps(config, indent=2))
    if hf is not None:
        (path / "hf_quant_config.json").write_text(json.dumps(hf, indent=2))
    if reference is not None:
        ref = write_tiny_checkpoint(architecture, reference, dtype="float32", seed=seed,
                                    registry=registry, **config_overrides)
        floats = {n: dequantize(quantized[n]) if n in quantized else v for n, v in tensors.items()}
        write_safetensors(ref / "model.safetensors", floats, {"format": "pt"})
    return path
