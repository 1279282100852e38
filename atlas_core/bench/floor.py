"""The decode floor: the bytes a decode step must move (see
:class:`~atlas_core.engine.step_timing.StepBytes`) over the device's memory bandwidth.

:func:`floor_line` is the start-up line that tells users the ceiling and gives the engine's
decode-step timer the bandwidth ``/metrics`` needs for ``atlas_decode_floor_fraction``.
"""

from __future__ import annotations

import time
from typing import Any

#: Memory bandwidth in GB/s by device-name fragment. H200: the device-to-device copy rate
#: measured by ``atlas bench`` (4.25-4.3 TB/s of the 4.8 TB/s datasheet figure); H100 SXM
#: and GB10: datasheet.
KNOWN_BANDWIDTH_GBS = {"H200": 4250.0, "H100": 3350.0, "GB10": 273.0}


def known_bandwidth(device_name: str) -> float | None:
    """GB/s of a device named in :data:`KNOWN_BANDWIDTH_GBS`, else ``None``."""
    for fragment, gbs in KNOWN_BANDWIDTH_GBS.items():
        if fragment.lower() in device_name.lower():
            return gbs
    return None


def copy_bandwidth(backend: Any, nbytes: int, reps: int = 10) -> float:
    """Device-to-device copy rate in GB/s, counting bytes read plus bytes written."""
    import numpy as np
    a = backend.empty((nbytes,), np.uint8)
    b = backend.empty((nbytes,), np.uint8)
    backend.copy_(b, a)
    backend.synchronize()
    start = time.perf_counter()
    for _ in range(reps):
        backend.copy_(b, a)
    backend.synchronize()
    return 2 * nbytes * reps / (time.perf_counter() - start) / 1e9


def device_bandwidth(backend: Any, probe_bytes: int = 256 << 20) -> tuple[float | None, str]:
    """``(GB/s, where it came from)``: the known figure of the device, else a copy probe on GPU
    backends (a parallel run's front probes rank 0's device through its worker); ``(None,
    reason)`` on CPU backends."""
    info = backend.device_info()
    known = known_bandwidth(info.name)
    if known:
        return known, f"{info.name}"
    if info.kind == "cpu":
        return None, "n/a on the CPU backend"
    probe = getattr(backend, "probe_bandwidth", None)  # a parallel run's front (FrontBackend)
    if probe is not None:
        gbs, how = probe(probe_bytes)
        return (gbs, f"rank 0's {info.name}, {how}") if gbs else (None, f"n/a ({how})")
    try:
        return copy_bandwidth(backend, probe_bytes), f"{info.name}, measured copy"
    except Exception as exc:  # noqa: BLE001 - the floor is information; serving goes on
        return None, f"n/a (the copy probe failed: {exc})"


def floor_line(engine: Any) -> str:
    """The start-up line stating the model's batch-1 decode floor on this device; also gives
    the engine's :class:`~atlas_core.engine.step_timing.DecodeStepTimer` the bandwidth
    it needs for ``/metrics``."""
    timer = engine.decode_timer
    gbs, source = device_bandwidth(engine.backend)
    if gbs is None:
        return f"decode floor: {source}"
    timer.bandwidth_gbs = gbs
    nbytes = timer.step_bytes(1, 1024)
    ranks = getattr(timer.step_bytes, "world_size", 1)
    read = (f"GB read per step by the busiest of {ranks} ranks, at one GPU's" if ranks > 1
            else "GB read per step at")
    return (f"decode floor: {gbs * 1e9 / nbytes:,.0f} tok/s at batch 1 with 1,024 tokens of "
            f"context ({nbytes / 1e9:.2f} {read} {gbs:,.0f} GB/s, {source}); "
            "/metrics reports atlas_decode_floor_fraction")
