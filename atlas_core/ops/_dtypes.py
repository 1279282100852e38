"""Dtype helpers shared by the NumPy references (bf16 / fp8 through ml_dtypes)."""

from __future__ import annotations

import ml_dtypes
import numpy as np

bfloat16 = np.dtype(ml_dtypes.bfloat16)
float8_e4m3fn = np.dtype(ml_dtypes.float8_e4m3fn)

DTYPES = {
    "float32": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
    "bfloat16": bfloat16,
    "float8_e4m3fn": float8_e4m3fn,
}


def f32(x: np.ndarray) -> np.ndarray:
    """View-or-convert to float32 for accumulation."""
    return np.asarray(x, dtype=np.float32)


def as_dtype(name_or_dtype) -> np.dtype:
    """``"bfloat16"`` / ``"bf16"`` / ``torch_dtype`` strings / NumPy dtypes -> NumPy dtype."""
    if isinstance(name_or_dtype, str):
        key = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32",
               "float": "float32", "fp8": "float8_e4m3fn", "float8_e4m3": "float8_e4m3fn"}.get(
            name_or_dtype, name_or_dtype)
        if key not in DTYPES:
            raise ValueError(f"unsupported dtype {name_or_dtype!r}; use one of {', '.join(DTYPES)}")
        return DTYPES[key]
    return np.dtype(name_or_dtype)
