"""GpuBackend: the contract every compute backend (numpy, mock, cuda…) fulfils."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np


@dataclass(frozen=True)
class DeviceInfo:
    """What a backend runs on.

    Attributes:
        name: human-readable device name, e.g. ``"NVIDIA H200"`` or ``"cpu"``.
        kind: ``"cpu"``, ``"cuda"``…
        total_memory: bytes of device memory (host RAM for CPU backends).
        compute_capability: e.g. ``"9.0"``; empty for CPU backends.
        unified_memory: the GPU shares the host's RAM (an integrated GPU: GB10 / DGX Spark,
            Jetson): free memory counts what the OS and other programs need too, so
            :meth:`GpuBackend.memory_info` reports at most ``/proc/meminfo`` MemAvailable and
            sizing keeps a share for the system.
    """

    name: str
    kind: str
    total_memory: int
    compute_capability: str = ""
    unified_memory: bool = False


class Graph(ABC):
    """A captured sequence of device work that can be replayed."""

    @abstractmethod
    def replay(self) -> None:
        """Re-run the captured work on the same buffers."""


class EagerGraph(Graph):
    """Fallback 'graph' for backends without capture: replays by calling the function again."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn

    def replay(self) -> None:
        """Run the captured function again."""
        self.fn()


class HostRead:
    """A device->host copy started by :meth:`GpuBackend.to_host_async`; :meth:`wait` gives it."""

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def wait(self) -> np.ndarray:
        """Block until the copy is done; return the host array."""
        return self.array


class DeviceEvent:
    """A point in a backend's queue of device work, made by :meth:`GpuBackend.record_event`:
    complete once every copy and op queued before it has finished. Lets the host wait for one
    transfer (or only ask whether it is done) instead of :meth:`GpuBackend.synchronize`, which
    also waits for everything queued after it, such as a decode step. This base class is an
    event that is complete from the start: what backends that finish all work before
    returning hand out."""

    def query(self) -> bool:
        """Whether the work before the event has finished (never blocks)."""
        return True

    def wait(self) -> None:
        """Block until the work before the event has finished."""


class GpuBackend(ABC):
    """A device that stores arrays and runs the ops of :mod:`atlas_core.ops`.

    Arrays are backend objects with ``.shape``, ``.dtype`` (a NumPy dtype, ``ml_dtypes`` for
    bf16/fp8), ``.reshape(*shape)`` returning a view of a contiguous array, and basic slicing
    along the first axis (``a[i:j]``) returning a view. Host data enters with
    :meth:`from_host` / :meth:`copy_from_host` and leaves with :meth:`to_host`.

    Ops live on ``self.ops``: the op table built from the registered op specs
    (:mod:`atlas_core.ops.registry`), one method per op with the signature and semantics of its
    NumPy reference. Ops return newly produced arrays taken from
    the backend's step workspace (see :meth:`reset_workspace`); ops documented as in-place write
    into the arrays passed to them.

    Required: everything abstract below. Optional: graph capture, streams, workspace handling.
    """

    name: str = "abstract"
    ops: Any
    #: Optional. Quantized weight formats (:data:`atlas_core.ops.quant.FORMATS`) this backend
    #: keeps on the device and computes with; the loader dequantizes any other at load.
    quantized_weight_formats: frozenset = frozenset()
    #: Optional. How a user makes this backend keep quantized weights when it does not by
    #: default (the size error of a dequantized checkpoint that would not fit says it).
    keep_quantized_hint: str = ""
    #: Set by ``--dequantize-weights`` (:func:`atlas_core.model.quantized_loading.
    #: dequantize_all`): keep no quantized format, whatever a policy or the size check says.
    dequantize_requested: bool = False

    def keep_quantized(self) -> bool:
        """Optional. Start keeping quantized weights on the device (the formats the backend
        computes with but does not keep by default; see ``keep_quantized_hint``) and return
        True, or return False when it cannot (the default). The loaders call it when a
        quantized checkpoint fits the device only kept quantized, unless
        ``dequantize_requested``."""
        return False
    #: Optional. ``--kv-cache-dtype`` values whose pools this backend's cache and attention ops
    #: take, besides the model's own dtype: ``fp8`` (float8_e4m3fn) and ``nvfp4`` (``uint8``
    #: packed rows, :mod:`atlas_core.ops.kv_quant`). The engine refuses the others up front.
    kv_cache_dtypes: frozenset = frozenset({"bf16", "fp8"})

    @abstractmethod
    def device_info(self) -> DeviceInfo:
        """Describe the device."""

    @abstractmethod
    def memory_info(self) -> tuple[int, int]:
        """Return ``(free_bytes, total_bytes)`` of device memory right now."""

    @abstractmethod
    def empty(self, shape: Sequence[int], dtype: Any) -> Any:
        """Allocate an uninitialised array that lives until dropped (weights, KV cache)."""

    @abstractmethod
    def from_host(self, array: np.ndarray) -> Any:
        """Allocate a device array holding a copy of the host ``array``."""

    @abstractmethod
    def copy_from_host(self, dst: Any, src: np.ndarray) -> None:
        """Copy host ``src`` into the existing device array ``dst`` (same size)."""

    @abstractmethod
    def to_host(self, array: Any) -> np.ndarray:
        """Copy a device array to a new host array (waits for pending work on it)."""

    @abstractmethod
    def copy_(self, dst: Any, src: Any) -> None:
        """Device-to-device copy of ``src`` into ``dst`` (same shape and dtype)."""

    @abstractmethod
    def synchronize(self) -> None:
        """Block until all submitted device work has finished."""

    def copy_many(self, host_pairs: Sequence[tuple[Any, np.ndarray]],
                  device_pairs: Sequence[tuple[Any, Any]] = ()) -> None:
        """Optional. ``copy_from_host`` for each ``(dst, host src)`` then ``copy_`` for each
        ``(dst, device src)``; no destination overlaps another or a source. A step's inputs go
        through here, so a device backend may batch them into one transfer (the default
        copies them one at a time)."""
        for dst, src in host_pairs:
            self.copy_from_host(dst, src)
        for dst, src in device_pairs:
            self.copy_(dst, src)

    def to_host_async(self, array: Any) -> HostRead:
        """Optional. Queue a copy of ``array`` to the host and return without waiting for it.

        The copy sees ``array`` as the work queued before this call leaves it (later work may
        overwrite ``array``); :meth:`HostRead.wait` blocks until it is done. The default copies
        now, which is the same thing on a backend that runs every op synchronously.
        """
        return HostRead(self.to_host(array))

    def empty_pinned(self, shape: Sequence[int], dtype: Any) -> np.ndarray:
        """Optional. An uninitialised host array that :meth:`copy_from_host_async` and
        :meth:`copy_to_host_async` move at the full speed of the host link, with no bounce
        through a staging buffer (page-locked memory on cuda): the KV tiers' host rows. Meant
        for a few large, long-lived buffers. Default: ``np.empty``."""
        return np.empty(tuple(shape), dtype=dtype)

    def record_event(self) -> DeviceEvent:
        """Optional. A :class:`DeviceEvent` after the work queued so far (copies included):
        the host waits on it for one transfer without waiting for later work. Default: a
        complete event (right for backends whose copies and ops finish before returning)."""
        return DeviceEvent()

    def copy_from_host_async(self, dst: Any, src: np.ndarray) -> None:
        """Optional. :meth:`copy_from_host` that may return before ``src`` has been read: the
        caller leaves ``src`` unchanged (and alive) until :meth:`synchronize`, or until an event
        recorded after the copy completes. Large copies from :meth:`empty_pinned` arrays go
        straight to the device this way. Default: copies now."""
        self.copy_from_host(dst, src)

    def copy_to_host_async(self, dst: np.ndarray, src: Any) -> None:
        """Optional. Copy the bytes of device array ``src`` into the existing contiguous host
        array ``dst`` (same number of bytes); ``dst`` holds them once :meth:`synchronize`
        returns, or once an event recorded after the copy completes (large copies into
        :meth:`empty_pinned` arrays run asynchronously). Default: :meth:`to_host` now, then a
        host copy."""
        host = self.to_host(src)
        if host.nbytes != dst.nbytes:
            raise ValueError(f"copy_to_host_async: {host.nbytes} device bytes into {dst.nbytes} "
                             "host bytes")
        dst.reshape(-1).view(np.uint8)[:] = host.reshape(-1).view(np.uint8)

    def zeros(self, shape: Sequence[int], dtype: Any) -> Any:
        """Optional. Allocate a zero-filled array (default: host zeros copied in)."""
        return self.from_host(np.zeros(shape, dtype=dtype))

    def fill_random(self, array: Any, seed: int, std: float, mean: float = 0.0) -> None:
        """Optional. Overwrite ``array`` with deterministic pseudo-random values of the given
        mean and standard deviation (for random-weight benchmarks, not for statistics).

        The same ``seed`` gives the same values on the same backend. The default draws normals
        on the host and uploads them; device backends override it with a kernel so a 60 GB
        model fills in well under a second.
        """
        host = np.random.default_rng(seed).standard_normal(tuple(array.shape), dtype=np.float32)
        host *= np.float32(std)
        host += np.float32(mean)
        self.copy_from_host(array, host.astype(array.dtype))

    def reset_workspace(self) -> None:
        """Optional. Start a new step: op outputs from before may now be overwritten.

        Backends that hand op outputs out of a bump arena reset it here, so a decode step
        allocates nothing and replays into the same addresses (what makes graph capture work).
        """

    def bind_model(self, model: str | None, quant: str | None = None) -> None:
        """Optional. Called by the model loader once config.json is read, before any weight is
        loaded: ``model`` is the config's ``model_type`` (``"qwen3_moe"``), ``quant`` the
        checkpoint's quantization method (``"fp8"``, ``"nvfp4"``) or None. A backend that tunes
        kernels per model family chooses them here. Default: nothing."""

    def set_batch_invariant(self, on: bool) -> None:
        """Optional. Batch-invariant mode (``EngineArgs.batch_invariant``): from now on every op
        computes a row with the same bits whatever else shares the call (how many rows, where
        the row sits, prefill or decode neighbours), at whatever cost. Called before the
        weights load. Default: refused when ``on``, as a backend that does not say how it keeps
        that promise cannot keep it (the numpy backend always is batch invariant)."""
        if on:
            raise NotImplementedError(f"the {self.name} backend has no batch-invariant mode")

    def layer_scope(self, nbytes: int) -> Any:
        """Optional. Called by the model loop before its layers with the bytes each layer hands
        to the next (hidden + residual); returns None or an object whose ``carry(*arrays)``,
        called after every layer, returns those arrays (maybe moved) and lets the backend reuse
        everything else that layer's ops allocated. Default: None (nothing to reuse)."""
        return None

    @property
    def supports_graphs(self) -> bool:
        """Optional. True when :meth:`capture` records real device graphs."""
        return False

    def capture(self, fn: Callable[[], Any]) -> Graph:
        """Optional. Record the device work ``fn`` launches; replay it later.

        The default runs nothing now and calls ``fn`` on every replay (eager fallback).
        """
        return EagerGraph(fn)

    def close(self) -> None:
        """Optional. Release device resources."""
