"""NVRTC build of kernel sources with an on-disk cubin cache.

Each ``.cu`` file is one module. Files that instantiate per dtype (``INSTANTIATE(...)``) are
compiled once per activation dtype with ``-DATLAS_T=.. -DATLAS_S=..``. Local includes are
inlined (searched through the same override path as the sources), so the cache key, a hash of
the inlined source + arch + options + NVRTC version, covers everything that affects the cubin.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import time
from pathlib import Path

DTYPE_VARIANTS = {
    "bf16": ("bf16", "bf16", 1),
    "f16": ("f16", "f16", 1),
    "f32": ("float", "f32", 0),
}
_INCLUDE = re.compile(r'^\s*#include\s+"([^"]+)"\s*$')
#: Modules this process compiled (cache misses) and the seconds NVRTC took, for the log.
_COMPILED = [0, 0.0]

log = logging.getLogger(__name__)


def compiled_seconds() -> float:
    """Seconds NVRTC has spent compiling in this process so far."""
    return _COMPILED[1]


class KernelCompileError(RuntimeError):
    """NVRTC rejected a kernel source."""


def nvrtc_version() -> str:
    from cuda.bindings import nvrtc
    err, major, minor = nvrtc.nvrtcVersion()
    return f"{major}.{minor}"


def nvrtc_program_text(prog, what: str = "log") -> str:
    """The compile log (``what="log"``) or PTX (``"ptx"``) of an ``nvrtcProgram`` made with
    ``cuda.bindings.nvrtc``.

    NVRTC writes into the buffer it is given, so the buffer is a fresh ``bytearray``: the
    idiom ``b" " * size`` returns CPython's shared one-byte ``b" "`` when ``size`` is 1 (an
    empty log is one NUL byte), and NVRTC then turns every ``b" "`` of the process into
    ``b"\\x00"`` (which broke every safetensors header padded after it).
    """
    from cuda.bindings import nvrtc
    get_size, get = {"log": (nvrtc.nvrtcGetProgramLogSize, nvrtc.nvrtcGetProgramLog),
                     "ptx": (nvrtc.nvrtcGetPTXSize, nvrtc.nvrtcGetPTX)}[what]
    _, size = get_size(prog)
    buf = bytearray(size)
    get(prog, buf)
    return buf.rstrip(b"\0").decode(errors="replace")


class KernelSources:
    """Finds and inlines kernel sources through an override path (most specific dir first)."""

    def __init__(self, search_dirs: list[Path]) -> None:
        self.search_dirs = [Path(d) for d in search_dirs]

    def find(self, filename: str) -> Path:
        for d in self.search_dirs:
            if (d / filename).is_file():
                return d / filename
        raise FileNotFoundError(f"kernel source {filename!r} not found in "
                                f"{', '.join(map(str, self.search_dirs))}")

    def modules(self) -> list[str]:
        """Names (without ``.cu``) of every module on the path."""
        names = {p.stem for d in self.search_dirs for p in d.glob("*.cu")}
        return sorted(names)

    def text(self, filename: str, _seen: set | None = None) -> str:
        """``filename`` with its local includes inlined, each file once (as ``#pragma once``)."""
        seen = {filename} if _seen is None else _seen
        path = self.find(filename)
        out = []
        for line in path.read_text().splitlines():
            m = _INCLUDE.match(line)
            if m:
                if m.group(1) not in seen:
                    seen.add(m.group(1))
                    out.append(self.text(m.group(1), seen))
            elif line.strip() != "#pragma once":
                out.append(line)
        return "\n".join(out) + "\n"

    def variants(self, module: str) -> list[str]:
        """Dtype variants a module is built in (``["any"]`` for dtype-free modules)."""
        own = self.find(module + ".cu").read_text()
        return list(DTYPE_VARIANTS) if "INSTANTIATE(" in own else ["any"]


def build_options(arch: str, variant: str) -> dict:
    """NVRTC options (as :class:`cuda.core.ProgramOptions` fields) for one build."""
    opts = {"arch": arch, "std": "c++17"}
    if variant in DTYPE_VARIANTS:
        t, s, mma = DTYPE_VARIANTS[variant]
        opts["define_macro"] = [("ATLAS_T", t), ("ATLAS_S", s), ("ATLAS_MMA", str(mma))]
    extra = extra_defines()
    if extra:
        opts["define_macro"] = list(opts.get("define_macro", [])) + extra
    return opts


def add_define(name: str) -> None:
    """Add macro ``name`` to ``ATLAS_CUDA_NVRTC_DEFINES`` unless it is there (the profiling
    scripts' builds: ``ATLAS_PROFILE``, ``ATLAS_TRACE``); call before the first kernel build."""
    defines = os.environ.get("ATLAS_CUDA_NVRTC_DEFINES", "")
    if name not in (d.strip().partition("=")[0] for d in defines.split(",")):
        os.environ["ATLAS_CUDA_NVRTC_DEFINES"] = ",".join(x for x in (defines, name) if x)


def extra_defines() -> list:
    """``ATLAS_CUDA_NVRTC_DEFINES``: comma-separated ``NAME`` or ``NAME=VALUE`` macros added to
    every build (profiling builds, e.g. ``ATLAS_PROFILE`` for scripts/kernel_phases.py); they
    are part of the cache key, so such builds never replace the normal cubins."""
    out: list = []
    for item in os.environ.get("ATLAS_CUDA_NVRTC_DEFINES", "").split(","):
        item = item.strip()
        if not item:
            continue
        name, _, value = item.partition("=")
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise ValueError(f"ATLAS_CUDA_NVRTC_DEFINES: {name!r} is not a macro name; use "
                             "NAME or NAME=VALUE, comma-separated")
        out.append((name, value) if value else name)
    return out


def compile_module(sources: KernelSources, module: str, variant: str, arch: str,
                   cache_dir: Path | None) -> bytes:
    """Cubin bytes of ``module`` for ``variant`` and ``arch`` (from the cache when present)."""
    src = sources.text(module + ".cu")
    opts = build_options(arch, variant)
    key = hashlib.sha256("\0".join([src, repr(sorted(opts.items())), nvrtc_version()]).encode())
    path = cache_dir / f"{module}-{variant}-{arch}-{key.hexdigest()[:32]}.cubin" if cache_dir else None
    if path is not None and path.is_file():
        return path.read_bytes()
    start = time.perf_counter()
    cubin = _nvrtc(src, module, opts)
    seconds = time.perf_counter() - start
    _COMPILED[0] += 1
    _COMPILED[1] += seconds
    log.info("NVRTC compiled %s.cu (%s, %s) in %.1f s; %d modules compiled so far, %.1f s",
             module, variant, arch, seconds, _COMPILED[0], _COMPILED[1])
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_bytes(cubin)
        os.replace(tmp, path)
    return cubin


def _nvrtc(src: str, module: str, opts: dict) -> bytes:
    from cuda.core import Program, ProgramOptions
    try:
        program = Program(src, "c++", ProgramOptions(name=f"{module}.cu", **opts))
        return bytes(program.compile("cubin").code)
    except Exception as exc:
        raise KernelCompileError(f"NVRTC failed on {module}.cu for {opts['arch']}: {exc}") from exc
