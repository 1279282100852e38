"""Hardware targets: which kernel directories and NVRTC arch serve a given GPU.

A target plugin (``atlas-hopper``, ``atlas-gb10``…) registers a :class:`Target` factory through
the ``register_kernel_targets`` hook, like every other plugin. Its kernel directory mirrors
``kernels/<hw>/``: ``common/`` plus optional ``<model>/<quant>/`` overrides, and
``HARDWARE.toml`` (whose ``[policy]`` holds the target's kernel policy defaults). Files there
override the generic ``kernels/cuda/common`` sources shipped in this package, by file name.
"""

from __future__ import annotations

import logging
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


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

    def model_folder(self, model_type: str | None) -> str | None:
        """The folder of this target tuned for ``model_type`` (config.json's, e.g.
        ``"qwen3_moe"``): ``<model_type>/``, else the family before the first ``_``
        (``qwen3/``); None when the target has neither."""
        if self.root is None or not model_type:
            return None
        for name in (model_type, model_type.split("_", 1)[0]):
            if (self.root / name).is_dir():
                return name
        return None

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


def load_targets(registry: Any = None) -> tuple[list[Target], list[tuple[str, str]]]:
    """Build every registered kernel target, in name order: ``(targets, failures)``, each failure
    ``(name, error)`` for a factory that raised or returned no :class:`Target`.

    Args:
        registry: an :class:`atlas_core.plugins.Registry` (default: a fresh one).
    """
    if registry is None:
        from atlas_core.api import Registry
        registry = Registry()
    targets, failures = [], []
    for name in registry.names("kernel_targets"):
        try:
            target = registry.get("kernel_targets", name)()
        except Exception as exc:  # noqa: BLE001 - one broken target must not hide the others
            failures.append((name, f"{type(exc).__name__}: {exc}"))
            continue
        if not isinstance(target, Target):
            failures.append((name, f"factory returned {type(target).__name__}, not a Target"))
            continue
        targets.append(target)
    return targets, failures


def installed_targets(registry: Any = None) -> list[Target]:
    """Every kernel target the plugins register (``register_kernel_targets``), in name order;
    targets that fail to build are skipped (``atlas plugins --strict`` reports them)."""
    return load_targets(registry)[0]


def generic_target(capability: tuple[int, int]) -> Target:
    """Fallback for GPUs no plugin claims: the generic kernels at the device's own arch."""
    return Target("cuda", f"sm_{capability[0]}{capability[1]}")


def pick_target(capability: tuple[int, int], registry: Any = None) -> Target:
    """The installed target serving ``capability``, else the generic one (targets that fail to
    build are logged and skipped)."""
    targets, broken = load_targets(registry)
    for name, error in broken:
        log.warning("kernel target %s skipped: %s", name, error)
    for target in targets:
        if capability in target.compute_capabilities:
            return target
    return generic_target(capability)
