"""The CUDA part of atlas-nemotron-h (extra ``atlas-nemotron-h[cuda]``): Mamba-2 kernels and
their wrappers. Importing this package is free; :mod:`atlas_nemotron_h.cuda.mamba2_ops` needs
atlas-cuda and is imported only when the cuda backend builds its op table."""

from __future__ import annotations

from importlib import resources
from pathlib import Path


def kernel_dir() -> Path:
    """The ``.cu`` sources shipped in this package (``mamba2.cu``), searched by the cuda
    backend after its own."""
    return Path(str(resources.files(__package__) / "kernels"))
