"""The CUDA part of atlas-gemma4 (extra ``atlas-gemma4[cuda]``): the kernels of ``mul``,
``softcap`` and ``sliding_window_attention`` and their wrappers. Importing this package is free;
:mod:`atlas_gemma4.cuda.gemma4_ops` needs atlas-cuda and is imported only when the cuda backend
builds its op table."""

from __future__ import annotations

from importlib import resources
from pathlib import Path


def kernel_dir() -> Path:
    """The ``.cu`` sources shipped in this package (``gemma4_elementwise.cu``,
    ``gemma4_attention.cu``, ``gemma4_attention_mma.cu`` and their ``gemma4_attention.cuh``),
    searched by the cuda backend after its own."""
    return Path(str(resources.files(__package__) / "kernels"))
