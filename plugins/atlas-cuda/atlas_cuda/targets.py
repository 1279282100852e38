"""Hardware targets: which kernel directories and NVRTC arch serve a given GPU.

A target plugin (``atlas-hopper``, ``atlas-gb10``…) advertises a :class:`Target` factory under
the entry-point group ``atlas_cuda.targets``. Its kernel directory mirrors ``kernels/<hw>/``:
``common/`` plus optional ``<model>/<quant>/`` overrides, and ``HARDWARE.toml``. Files there
override the generic ``kernels/cuda/common`` sources shipped in this package, by file name.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from importlib import metadata, resources
from pathlib import Path

TARGET_GROUP = "atlas_cuda.targets"


def generic_kernel_dir() -> Path:
    """``kernels/cuda`` as shipped inside this package."""
    return Path(str(resources.files("atlas_cuda") / "kernels"))


@dataclass
class Target:
    """One hardware target.

    Attributes:
        name: e.g. ``"hopper"``.
        arch: NVRTC arch, e.g. ``"sm_90a"``.
        root: the target's kernel directory (``kernels/<hw>``), or None for the generic one.
        compute_capabilities: ``(major, minor)`` pairs this target serves.
        hardware: parsed ``HARDWARE.toml``.
    """

    name: str
    arch: str
    root: Path | None = None
    compute_capabilities: tuple[tuple[int, int], ...] = ()
    hardware: dict = field(default_factory=dict)

    @classmethod
    def from_dir(cls, root: Path) -> "Target":
        """Build a target from ``root/common/HARDWARE.toml`` (``name``, ``arch``, ``compute_capability``)."""
        hw = tomllib.loads((root / "common" / "HARDWARE.toml").read_text())
        caps = tuple(tuple(int(p) for p in c.split(".")) for c in hw.get("compute_capability", []))
        return cls(hw["name"], hw["arch"], root, caps, hw)

    def search_dirs(self, model: str | None = None, quant: str | None = None) -> list[Path]:
        """Source directories, most specific first."""
        dirs = []
        if self.root is not None:
            if model and quant:
                dirs.append(self.root / model / quant)
            if model:
                dirs.append(self.root / model)
            dirs.append(self.root / "common")
        dirs.append(generic_kernel_dir() / "common")
        return [d for d in dirs if d.is_dir()]


def installed_targets() -> list[Target]:
    """Every target advertised by an installed plugin, in entry-point name order."""
    out = []
    for ep in sorted(metadata.entry_points(group=TARGET_GROUP), key=lambda e: e.name):
        out.append(ep.load()())
    return out


def generic_target(capability: tuple[int, int]) -> Target:
    """Fallback for GPUs no plugin claims: the generic kernels at the device's own arch."""
    return Target("cuda", f"sm_{capability[0]}{capability[1]}")


def pick_target(capability: tuple[int, int]) -> Target:
    """The installed target serving ``capability``, else the generic one."""
    for target in installed_targets():
        if capability in target.compute_capabilities:
            return target
    return generic_target(capability)
