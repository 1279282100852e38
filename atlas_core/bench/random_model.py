"""Random-weight models built straight on the device: no checkpoint is written or read.

A named shape's config goes through its registered loader's ``build`` (the same model tree a
checkpoint would fill), every parameter is allocated with ``materialize`` and then overwritten
in place by :meth:`~atlas_core.interfaces.GpuBackend.fill_random`, so a 60 GB model is ready
in seconds on a GPU and never touches the disk.
"""

from __future__ import annotations

import math
from typing import Any

from atlas_core.model.decoder_loader import model_dtype
from atlas_core.model.loader import architecture, create_loader
from atlas_core.ops.quant import E2M1_VALUES, QuantizedWeight, layout

#: Parameters a quantized random model keeps quantized (the projections and expert stacks; the
#: embedding, lm_head, routers and norms stay in the model dtype, as in real checkpoints).
QUANTIZED_SUFFIXES = ("_proj.weight", "experts.gate_up_proj", "experts.down_proj")
#: RMS of a uniformly random E2M1 code.
_E2M1_RMS = float(math.sqrt((E2M1_VALUES ** 2).mean()))


def quant_format(config: dict[str, Any]) -> tuple[str, tuple[int, int] | None] | None:
    """``(format, block_size)`` a shape's ``quantization_config`` asks for: FP8 blocks
    (``quant_method: fp8``, ``weight_block_size``) or NVFP4 (``quant_algo: NVFP4``); None for
    an unquantized shape."""
    quant = config.get("quantization_config")
    if not quant:
        return None
    if str(quant.get("quant_algo", "")).upper() == "NVFP4":
        return "nvfp4", None
    if quant.get("quant_method") == "fp8":
        return "fp8_block", tuple(quant.get("weight_block_size") or (128, 128))
    raise ValueError(f"random models support FP8 block and NVFP4 shapes, not {quant}")


def quantized_allocator(config: dict[str, Any], backend: Any):
    """``Module.materialize``'s ``allocate`` for a quantized shape: a :class:`QuantizedWeight`
    of device arrays for each :data:`QUANTIZED_SUFFIXES` parameter; None (plain) otherwise, or
    for every parameter when the shape is not quantized or ``backend`` keeps no such format."""
    fmt = quant_format(config)
    if fmt is None or fmt[0] not in getattr(backend, "quantized_weight_formats", ()):
        return None

    def allocate(module: Any, param: str) -> QuantizedWeight | None:
        spec = module.specs[param]
        if not (spec.quantizable and param.endswith(QUANTIZED_SUFFIXES)):
            return None
        return empty_quantized(backend, fmt[0], fmt[1], spec.shape, module.dtype)

    return allocate


def empty_quantized(backend: Any, fmt: str, block_size: tuple[int, int] | None,
                    shape: tuple[int, ...], dtype: Any) -> QuantizedWeight:
    """A :class:`QuantizedWeight` of ``shape`` in ``fmt`` whose arrays are uninitialised
    ``backend`` allocations (fill them with :func:`fill_random_quantized`)."""
    shapes, dtypes = layout(fmt, shape, block_size), _quant_dtypes(fmt)
    arrays = {k: None if shapes[k] is None else backend.empty(shapes[k], dtypes[k])
              for k in dtypes}
    return QuantizedWeight(fmt, arrays["data"], arrays["scale"], shape, dtype, block_size,
                           arrays["global_scale"])


def _quant_dtypes(fmt: str) -> dict[str, Any]:
    """The dtype of each array of a :class:`QuantizedWeight` in ``fmt``."""
    import numpy as np

    from atlas_core.ops._dtypes import float8_e4m3fn
    if fmt == "nvfp4":
        return {"data": np.dtype(np.uint8), "scale": float8_e4m3fn,
                "global_scale": np.dtype(np.float32)}
    return {"data": float8_e4m3fn, "scale": np.dtype(np.float32),
            "global_scale": np.dtype(np.float32)}


def random_weight_bytes(model: Any, config: dict[str, Any], backend: Any,
                        dtype: Any) -> tuple[int, int]:
    """``(bytes materialize will allocate, bytes if every quantizable projection were kept
    quantized)`` for ``model`` (built, not materialized; ``dtype`` its model dtype) on
    ``backend``: a quantized config's projections count packed where the backend keeps the
    format (:func:`quantized_allocator`), in ``dtype`` where it would dequantize them."""
    import numpy as np
    fmt = quant_format(config)
    formats = getattr(backend, "quantized_weight_formats", ()) or ()
    need = quantized = 0
    for _name, _module, local, spec in model.named_specs():
        plain = math.prod(spec.shape) * np.dtype(spec.dtype or dtype).itemsize
        if fmt is not None and spec.quantizable and local.endswith(QUANTIZED_SUFFIXES):
            shapes, dtypes = layout(fmt[0], spec.shape, fmt[1]), _quant_dtypes(fmt[0])
            packed = sum(math.prod(shapes[k]) * np.dtype(dtypes[k]).itemsize
                         for k in shapes if shapes[k] is not None)
            quantized += packed
            need += packed if fmt[0] in formats else plain
        else:
            quantized += plain
            need += plain
    return need, quantized


def check_random_fits(model: Any, config: dict[str, Any], backend: Any, dtype: Any) -> None:
    """Refuse, before allocating, random weights that cannot fit the device (the check a
    checkpoint gets from ``weight_loading.check_size``); under ``-tp`` ``model`` is one rank's
    shard. A quantized config the backend would dequantize is kept quantized instead
    (``backend.keep_quantized()``) when only that fits.

    Raises:
        WeightLoadError: the bytes needed and the device's, and how to keep a quantized config
            quantized when the backend would dequantize it and the quantized bytes would fit.
    """
    from atlas_core.model.quantized_loading import keeps_quantized_to_fit
    from atlas_core.model.weight_loading import WeightLoadError
    fmt = quant_format(config)
    formats = getattr(backend, "quantized_weight_formats", ()) or ()
    need, quantized = random_weight_bytes(model, config, backend, dtype)
    info = backend.device_info()
    if need <= info.total_memory or (
            fmt is not None and fmt[0] not in formats
            and keeps_quantized_to_fit(backend, need, quantized, info.total_memory,
                                       f"--load-format dummy on {info.name}")):
        return
    gib = 2 ** 30
    message = (f"--load-format dummy: this config's weights need {need / gib:,.1f} GiB (one "
               f"rank's share under -tp), more than the {info.total_memory / gib:,.1f} GiB of "
               f"{info.name}")
    hint = getattr(backend, "keep_quantized_hint", "")
    if fmt is not None and fmt[0] not in formats and hint and quantized <= info.total_memory:
        raise WeightLoadError(f"{message}: its {fmt[0]} projections are being dequantized "
                              f"({quantized / gib:,.1f} GiB kept quantized); {hint}")
    raise WeightLoadError(f"{message}: use more GPUs (-tp) or a smaller config")


def fill_random_quantized(backend: Any, w: QuantizedWeight, seed: int, std: float) -> None:
    """Random codes whose dequantized values have standard deviation ``std``: FP8 codes of
    unit std under constant scales ``std``; NVFP4 uniform random codes under unit block scales
    and a global scale of ``std`` over the RMS of a random code."""
    if w.format == "nvfp4":
        backend.fill_random(w.data, seed, 40.0, 127.5)
        backend.fill_random(w.scale, seed + 1, 0.0, 1.0)
        backend.fill_random(w.global_scale, seed + 2, 0.0, std / _E2M1_RMS)
        return
    backend.fill_random(w.data, seed, 1.0, 0.0)
    backend.fill_random(w.scale, seed + 1, 0.0, std)


def param_scale(name: str, shape: tuple[int, ...]) -> tuple[float, float]:
    """``(mean, std)`` of a random parameter: vectors (norm weights, biases, gate constants)
    near one, the embedding table of unit scale, matrices ``1 / sqrt(fan_in)`` so activations
    neither vanish nor overflow through the layers."""
    if len(shape) == 1:
        return 1.0, 0.05
    if name.endswith("embed_tokens.weight"):
        return 0.0, 1.0
    return 0.0, 1.0 / math.sqrt(shape[-1])


def fill_random_params(model: Any, backend: Any, seed: int = 0) -> int:
    """Overwrite every parameter of a materialized model; returns the bytes filled."""
    total = 0
    for i, (name, module, local, spec) in enumerate(model.named_specs()):
        array = module.params[local]
        mean, std = param_scale(name, spec.shape)
        if isinstance(array, QuantizedWeight):
            fill_random_quantized(backend, array, seed * 1_000_003 + i, std)
        else:
            backend.fill_random(array, seed * 1_000_003 + i, std, mean)
        total += array.nbytes
    return total


def build_random_model(config: dict[str, Any], backend: Any, registry: Any, *,
                       dtype: str | None = None, seed: int = 0) -> Any:
    """The model of ``config`` on ``backend`` with random weights (see the module docstring),
    every module's ``post_load`` run after the fill as a checkpoint load runs it.

    Args:
        config: a config.json dict (e.g. :func:`~atlas_core.bench.shapes.shape_config`).
        backend: a GpuBackend.
        registry: the plugin registry holding the architecture's weight loader.
        dtype: weight/activation dtype (default: the config's, else bfloat16); a shape with a
            ``quantization_config`` keeps its projections quantized (:func:`quantized_allocator`).
        seed: base seed; parameter ``i`` is filled with seed ``seed * 1000003 + i``.
    """
    loader = create_loader(registry, architecture(config))
    model = loader.build(config)
    check_random_fits(model, config, backend, model_dtype(config, dtype))
    model.materialize(backend, model_dtype(config, dtype), quantized_allocator(config, backend))
    fill_random_params(model, backend, seed)
    # what a checkpoint load does after the copies (load_weights): the layers' load-time folds
    # and layouts, so the bench times the forward a served checkpoint runs
    for module in model.modules():
        module.post_load()
    backend.synchronize()
    return model


def engine_for(model: str, backend: str | None = None, **fields: Any) -> Any:
    """An :class:`~atlas_core.engine.LLMEngine` for ``model``: a named bench shape
    (:data:`~atlas_core.bench.shapes.SHAPES`; random weights made on the device, no checkpoint
    on disk, token ids only) or a checkpoint directory / hub id. ``fields``: EngineArgs fields
    (the measurement scripts under ``scripts/`` use this)."""
    from atlas_core.bench.shapes import SHAPES, shape_config
    from atlas_core.engine import EngineArgs, LLMEngine
    if model not in SHAPES:
        return LLMEngine.from_args(EngineArgs(model=model, backend=backend, **fields))
    from atlas_core.engine.loading import create_backend
    device, registry = create_backend(backend)
    weights = build_random_model(shape_config(model), device, registry)
    return LLMEngine(weights, device, EngineArgs(model=model, backend=backend, **fields))
