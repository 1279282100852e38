"""The CUDA part of atlas-minimax (extra ``atlas-minimax[cuda]``): the ``moe_route_biased``
kernel and its wrapper. Importing this package is free; :mod:`atlas_minimax.cuda.routing_ops`
needs atlas-cuda and is imported only when the cuda backend builds its op table."""

from __future__ import annotations

from importlib import resources
from pathlib import Path


def kernel_dir() -> Path:
    """The folder of the ``.cu`` sources this package ships (``moe_route_biased.cu``)."""
    return Path(str(resources.files(__package__) / "kernels"))
