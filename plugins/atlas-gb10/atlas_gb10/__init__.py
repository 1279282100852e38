"""Atlas gb10 hardware target for the cuda backend (kernels under ``kernels/``)."""

from importlib import resources
from pathlib import Path


def target():
    """The :class:`atlas_cuda.targets.Target` of this package (reads its HARDWARE.toml)."""
    from atlas_cuda.targets import Target
    return Target.from_dir(Path(str(resources.files(__name__) / "kernels")))
