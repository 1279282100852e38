"""The CUDA part of atlas-toy (extra ``atlas-toy[cuda]``): the ``toy_softcap`` kernel and its
wrapper. Importing this package is free; :mod:`atlas_toy.cuda.softcap_ops` needs atlas-cuda
and is imported only when the cuda backend builds its op table."""

from __future__ import annotations

from importlib import resources
from pathlib import Path


def kernel_dir() -> Path:
    """The folder of the ``.cu`` sources this package ships (``toy_softcap.cu``)."""
    return Path(str(resources.files(__package__) / "kernels"))
