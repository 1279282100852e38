"""The CUDA part of atlas-qwen35 (extra ``atlas-qwen35[cuda]``): Gated DeltaNet kernels and their
wrappers. Importing this package is free; :mod:`atlas_qwen35.cuda.gdn_ops` needs atlas-cuda and
is imported only when the cuda backend builds its op table."""

from __future__ import annotations

from importlib import resources
from pathlib import Path


def kernel_dir() -> Path:
    """The ``.cu`` sources shipped in this package (``gdn.cu``, ``delta_rule.cu``,
    ``gdn_chunked.cu``), searched by the cuda backend after its own."""
    return Path(str(resources.files(__package__) / "kernels"))
