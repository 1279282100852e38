"""The CUDA part of atlas-qwen3vl (extra ``atlas-qwen3vl[cuda]``): the vision-tower kernels and
their wrappers. Importing this package is free; :mod:`atlas_qwen3vl.cuda.vision_ops` needs
atlas-cuda and is imported only when the cuda backend builds its op table."""

from __future__ import annotations

from importlib import resources
from pathlib import Path


def kernel_dir() -> Path:
    """The folder of the ``.cu`` sources this package ships (``vision.cu``)."""
    return Path(str(resources.files(__package__) / "kernels"))
