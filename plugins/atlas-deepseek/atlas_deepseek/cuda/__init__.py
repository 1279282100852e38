"""The CUDA part of atlas-deepseek (extra ``atlas-deepseek[cuda]``): the MLA kernels (latent
cache write, query rope, W_UK / W_UV absorption, absorbed and expanded attention, latent
gather) and the grouped MoE routing kernel, with their wrappers. Importing this package is free;
:mod:`atlas_deepseek.cuda.mla_ops` needs atlas-cuda and is imported only when the cuda backend
builds its op table."""

from __future__ import annotations

from importlib import resources
from pathlib import Path


def kernel_dir() -> Path:
    """The folder of the ``.cu`` sources this package ships (``mla.cu``, ``mla_attention.cu``,
    ``mla_decode_mma.cu``, ``mla_decode_keys.cu``, ``mla_decode_keys2.cu``,
    ``moe_route_grouped.cu`` and their header ``mla_common.cuh``)."""
    return Path(str(resources.files(__package__) / "kernels"))
