"""Per-layer KV-cache dtypes: ``--kv-cache-dtype`` with ``--kv-high-precision-layers``.

A low-precision KV cache (fp8, or nvfp4: ``uint8`` packed rows, :mod:`atlas_core.ops.kv_quant`)
costs accuracy mostly in a few layers; the original engine keeps the first and the last
attention layer in the model's dtype (``auto``), which costs little memory in a deep model.
Every consumer of the cache layout (sizing, pool allocation, the KV tiers' byte rows) takes the
per-layer list made here, so layers of different dtypes share one block table: a block is the
same tokens in every layer, only its bytes per layer differ.

Layers nvfp4 cannot hold stay in the model dtype whatever the flags say: MLA latent caches
(their ops read the latent as one dense vector) and sliding-window layers (their own attention
op); a plain attention layer whose ``head_dim`` is not a multiple of 32 is an error instead,
naming the layer.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from atlas_core.interfaces.layer import KVCacheSpec, LatentCacheSpec, SlidingWindowCacheSpec
from atlas_core.ops._dtypes import as_dtype, bfloat16, float8_e4m3fn
from atlas_core.ops.kv_quant import check_nvfp4_head_dim, nvfp4_row_bytes

#: Values of ``--kv-cache-dtype`` (aliases included).
KV_CACHE_DTYPES = ("auto", "bf16", "bfloat16", "fp8", "fp8_e4m3", "float8_e4m3fn", "nvfp4")
#: Device bytes a backend may take for one prefill step over an nvfp4 history (the cuda backend
#: dequantizes the step's cached blocks into a dense scratch for its flash kernel): kept out of
#: the KV pool by the sizing when any layer is nvfp4. 1 GiB holds four 32k-token qwen3-8b
#: sequences' K and V of one layer in bf16 (128 MiB each).
NVFP4_PREFILL_SCRATCH = 1 << 30
#: Storage dtype of nvfp4 pools.
NVFP4 = np.dtype(np.uint8)


def kv_cache_dtype(name: str, model_dtype: Any) -> np.dtype:
    """``auto`` -> the model's dtype; ``bf16`` -> bfloat16; ``fp8`` -> float8_e4m3fn storage;
    ``nvfp4`` -> ``uint8`` (packed rows)."""
    if name == "auto":
        return as_dtype(model_dtype)
    if name in ("bf16", "bfloat16"):
        return bfloat16
    if name in ("fp8", "fp8_e4m3", "float8_e4m3fn"):
        return float8_e4m3fn
    if name == "nvfp4":
        return NVFP4
    raise ValueError(f"kv_cache_dtype must be auto, bf16, fp8 or nvfp4, got {name!r}")


def dtype_flag(dtype: Any) -> str:
    """The ``--kv-cache-dtype`` name of a storage dtype (``nvfp4`` for ``uint8``)."""
    dtype = np.dtype(dtype)
    return "nvfp4" if dtype == NVFP4 else "fp8" if dtype == float8_e4m3fn else dtype.name


def parse_high_precision_layers(value: Any) -> str | tuple[int, ...]:
    """``auto``, ``none``, or the sorted layer indices of a comma list (``"0,35"``).

    Raises:
        ValueError: anything else (one line, naming the value).
    """
    if isinstance(value, (list, tuple)):
        items = list(value)
    else:
        text = str(value).strip().lower()
        if text in ("auto", "none"):
            return text
        items = [p.strip() for p in text.split(",")]
    try:
        layers = sorted({int(p) for p in items})
    except (TypeError, ValueError):
        layers = None
    if not layers or layers[0] < 0:
        raise ValueError(f"kv_high_precision_layers must be auto, none or a comma list of layer "
                         f"indices >= 0 (e.g. 0,35), got {value!r}")
    return tuple(layers)


def _nvfp4_capable(spec: KVCacheSpec) -> bool:
    return not isinstance(spec, (LatentCacheSpec, SlidingWindowCacheSpec))


def layer_kv_dtypes(specs: list, name: str, model_dtype: Any, high_precision: Any = "auto",
                    num_layers: int | None = None) -> list[np.dtype | None]:
    """The storage dtype of each layer's KV pools (``None`` for layers without a paged cache).

    Args:
        specs: the model's per-layer state specs (``model.kv_cache_specs()``).
        name: ``--kv-cache-dtype``.
        model_dtype: the model's activation dtype (what high-precision layers keep).
        high_precision: ``--kv-high-precision-layers``: ``auto`` (the first and the last
            attention layer of the decoder stack, an MTP layer after it not counted), ``none``,
            or layer indices; ignored when ``name`` is the model's own dtype.
        num_layers: decoder layers in ``specs`` (entries past them are MTP layers).

    Raises:
        ValueError: a listed index that is not an attention layer, or an nvfp4 layer whose
            ``head_dim`` is not a multiple of 32.
    """
    low, high = kv_cache_dtype(name, model_dtype), as_dtype(model_dtype)
    if low == NVFP4 or low.itemsize < high.itemsize:
        keep = _kept_layers(specs, parse_high_precision_layers(high_precision), num_layers)
    else:
        keep = set()
    dtypes: list[np.dtype | None] = []
    for i, spec in enumerate(specs):
        if not isinstance(spec, KVCacheSpec):
            dtypes.append(None)
        elif i in keep or (low == NVFP4 and not _nvfp4_capable(spec)):
            dtypes.append(high)
        else:
            if low == NVFP4:
                check_nvfp4_head_dim(spec.head_dim, f"layer {i}")
            dtypes.append(low)
    return dtypes


def _kept_layers(specs: list, choice: str | tuple[int, ...], num_layers: int | None) -> set[int]:
    attention = [i for i, s in enumerate(specs) if isinstance(s, KVCacheSpec)]
    if choice == "none" or not attention:
        return set()
    if choice == "auto":
        decoder = [i for i in attention if num_layers is None or i < num_layers] or attention
        return {decoder[0], decoder[-1]}
    wrong = [i for i in choice if i not in attention]
    if wrong:
        raise ValueError(f"kv_high_precision_layers: layer(s) {', '.join(map(str, wrong))} "
                         f"{'is' if len(wrong) == 1 else 'are'} not attention layers of this "
                         f"model (its attention layers: {_ranges(attention)})")
    return set(choice)


def pool_width(spec: KVCacheSpec, dtype: Any) -> int:
    """Last dim of a layer's pools: ``head_dim``, or the packed row bytes for nvfp4."""
    return nvfp4_row_bytes(spec.head_dim) if np.dtype(dtype) == NVFP4 else spec.head_dim


def layer_bytes_per_token(spec: KVCacheSpec, dtype: Any) -> int:
    """Bytes one token takes in one layer (all its pools)."""
    dtype = np.dtype(dtype)
    item = 1 if dtype == NVFP4 else dtype.itemsize
    return spec.num_pools * spec.num_kv_heads * pool_width(spec, dtype) * item


def kv_bytes_per_token(specs: list, dtype: Any) -> int:
    """Paged-cache bytes one token takes across every layer (K and V, or an MLA latent);
    ``dtype`` is one storage dtype for all layers or a per-layer list (:func:`layer_kv_dtypes`)."""
    dtypes = dtype if isinstance(dtype, (list, tuple)) else [dtype] * len(specs)
    return sum(layer_bytes_per_token(s, d) for s, d in zip(specs, dtypes)
               if isinstance(s, KVCacheSpec))


def describe_layer_dtypes(dtypes: list) -> str:
    """``nvfp4 (34 layers), bfloat16 (2 layers: 0, 35)``: the narrowest dtype first, the layers
    of the wider groups (the high-precision ones) listed."""
    groups: dict[str, tuple[int, list[int]]] = {}
    for i, d in enumerate(dtypes):
        if d is not None:
            bits = 4 if np.dtype(d) == NVFP4 else 8 * np.dtype(d).itemsize
            groups.setdefault(dtype_flag(d), (bits, []))[1].append(i)
    order = [(label, layers) for label, (_, layers) in
             sorted(groups.items(), key=lambda kv: kv[1][0])]
    parts = []
    for n, (label, layers) in enumerate(order):
        count = f"{len(layers)} layer{'s' if len(layers) != 1 else ''}"
        parts.append(f"{label} ({count})" if n == 0 else f"{label} ({count}: {_ranges(layers)})")
    return ", ".join(parts) or "none"


def _ranges(indices: list[int]) -> str:
    out, i = [], 0
    while i < len(indices):
        j = i
        while j + 1 < len(indices) and indices[j + 1] == indices[j] + 1:
            j += 1
        out.append(str(indices[i]) if j == i else f"{indices[i]}-{indices[j]}")
        i = j + 1
    return ", ".join(out)
