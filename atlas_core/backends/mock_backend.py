"""The ``mock`` GpuBackend: the numpy backend plus a log of everything a GPU would be asked to do.

Tests use it to assert GPU discipline on a laptop: no allocation in the decode loop, one host
sync per step, decode replayed from a captured graph.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from atlas_core.backends.numpy_backend import NumpyBackend
from atlas_core.interfaces import DeviceInfo, Graph
from atlas_core.interfaces.gpu_backend import DeviceEvent, HostRead
from atlas_core.ops.registry import OpRegistry, OpTable

#: Every event kind the mock records.
EVENT_KINDS = ("launch", "graph_node", "capture_node", "alloc", "workspace", "h2d", "d2h", "d2d",
               "sync", "event", "reset_workspace", "capture", "graph_launch")


@dataclass(frozen=True)
class Event:
    """One recorded event: ``kind`` from :data:`EVENT_KINDS`, ``name`` (op or API), ``nbytes``."""

    kind: str
    name: str = ""
    nbytes: int = 0


class Recording:
    """Events recorded inside one ``with backend.record() as rec:`` block."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def count(self, kind: str, name: str | None = None) -> int:
        """Number of events of ``kind`` (and op/API ``name`` when given)."""
        return sum(1 for e in self.events if e.kind == kind and (name is None or e.name == name))

    def bytes(self, kind: str) -> int:
        """Total bytes of the events of ``kind`` (``"h2d"``, ``"d2h"``, ``"alloc"``…)."""
        return sum(e.nbytes for e in self.events if e.kind == kind)

    def names(self, kind: str) -> list[str]:
        """Names of the events of ``kind`` in order, e.g. the ops launched."""
        return [e.name for e in self.events if e.kind == kind]

    @property
    def host_syncs(self) -> int:
        """Points where the host waited for the device: ``synchronize()`` and ``to_host()``."""
        return self.count("sync") + self.count("d2h")


class MockGraph(Graph):
    """A 'captured' graph: the op names seen at capture, replayed by calling the function again."""

    def __init__(self, backend: "MockGpuBackend", fn: Callable[[], Any], ops: list[str]) -> None:
        self.backend, self.fn, self.ops = backend, fn, ops

    def replay(self) -> None:
        self.backend._emit("graph_launch", f"{len(self.ops)} nodes")
        with self.backend._mode("graph_node"):
            self.fn()


class _MockRead(HostRead):
    def __init__(self, backend: "MockGpuBackend", array: np.ndarray) -> None:
        super().__init__(array)
        self.backend = backend

    def wait(self) -> np.ndarray:
        self.backend._emit("d2h", "to_host_async", self.array.nbytes)
        return self.array


def _nbytes(result: Any) -> int:
    if isinstance(result, np.ndarray):
        return result.nbytes
    if isinstance(result, tuple):
        return sum(_nbytes(r) for r in result)
    return 0


def _recording_table(backend: "MockGpuBackend", inner: OpTable,
                     registry: OpRegistry) -> OpTable:
    """``backend.ops`` of the mock: every op of the numpy table, logged as a launch."""
    table = OpTable("mock")
    for name in inner:
        setattr(table, name, _record(backend, name, getattr(inner, name),
                                     registry.spec(name).writes_args))
    return table


def _record(backend: "MockGpuBackend", name: str, fn: Callable, writes_args: bool) -> Callable:
    @functools.wraps(fn)
    def op(*args, **kwargs):
        backend._emit(backend._op_kind, name)
        if writes_args and backend._op_kind == "capture_node":
            # A CUDA capture records work without running it: keep caches and state intact.
            args = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
            kwargs = {k: v.copy() if isinstance(v, np.ndarray) else v for k, v in kwargs.items()}
        result = fn(*args, **kwargs)
        if backend._op_kind == "launch" and _nbytes(result):
            backend._emit("workspace", name, _nbytes(result))
        return result
    return op


class MockGpuBackend(NumpyBackend):
    """The numpy backend recording launches, allocations, copies, syncs and graphs.

    Every call appends an :class:`Event` to ``backend.events``:

    - ``launch`` (op name) for each op call; ``graph_node`` instead while a graph replays and
      ``capture_node`` while :meth:`capture` records; ``graph_launch`` once per replay;
      ``capture`` once per capture.
    - ``alloc`` (with bytes) for :meth:`empty`, :meth:`zeros`, :meth:`from_host`. Op outputs are
      ``workspace`` events (bytes taken from the step workspace), never ``alloc``.
    - ``h2d`` for :meth:`from_host` / :meth:`copy_from_host` (and ``copy_from_host_async``,
      which calls it), ``d2h`` for :meth:`to_host` / :meth:`copy_to_host_async`,
      ``d2d`` for :meth:`copy_` (with bytes); a :meth:`to_host_async` records its ``d2h`` when
      it is waited for; ``sync`` for :meth:`synchronize`; ``event`` for :meth:`record_event`
      (complete at once: every copy here is done when it returns, so waiting on one is no
      host sync);
      ``reset_workspace`` for :meth:`reset_workspace`.

    Query with ``backend.count(kind, name=None)``, ``backend.events``, ``backend.clear()``, or
    scope a block with :meth:`record`. A test of decode discipline reads::

        with backend.record() as rec:
            engine.step()                      # a decode step
        assert rec.count("alloc") == 0         # no allocation during decode
        assert rec.host_syncs == 1             # one sync (the sampled ids) per step
        assert rec.count("graph_launch") == 1 and rec.count("launch") == 0   # replayed graph

    Like a CUDA stream capture, :meth:`capture` runs the function's Python but leaves device
    state alone: ops that write their arguments (KV caches, recurrent state) run on copies, and
    copies into existing arrays are recorded, not done. Replays run everything for real.
    :meth:`synchronize` or :meth:`to_host` inside :meth:`capture` raise, as they would break a
    CUDA stream capture.
    """

    name = "mock"

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.events: list[Event] = []
        self._recordings: list[Recording] = []
        self._op_kind = "launch"
        self.ops = _recording_table(self, self.ops, self.op_registry)

    def _emit(self, kind: str, name: str = "", nbytes: int = 0) -> None:
        event = Event(kind, name, int(nbytes))
        self.events.append(event)
        for rec in self._recordings:
            rec.events.append(event)

    @contextlib.contextmanager
    def _mode(self, op_kind: str) -> Iterator[None]:
        previous, self._op_kind = self._op_kind, op_kind
        try:
            yield
        finally:
            self._op_kind = previous

    @contextlib.contextmanager
    def record(self) -> Iterator[Recording]:
        """Collect the events of a block: ``with backend.record() as rec: ...``."""
        rec = Recording()
        self._recordings.append(rec)
        try:
            yield rec
        finally:
            self._recordings.remove(rec)

    def count(self, kind: str, name: str | None = None) -> int:
        """Events of ``kind`` (and ``name``) since creation or the last :meth:`clear`."""
        return sum(1 for e in self.events if e.kind == kind and (name is None or e.name == name))

    def clear(self) -> None:
        """Forget every recorded event."""
        self.events.clear()

    def _check_not_capturing(self, what: str) -> None:
        if self._op_kind == "capture_node":
            raise RuntimeError(f"{what} during graph capture: a CUDA stream capture cannot wait "
                               "for the device; move it out of the captured function")

    def device_info(self) -> DeviceInfo:
        info = super().device_info()
        return DeviceInfo(name=f"mock GPU on {info.name}", kind="cpu", total_memory=info.total_memory)

    def empty(self, shape: Sequence[int], dtype: Any) -> np.ndarray:
        out = super().empty(shape, dtype)
        self._emit("alloc", "empty", out.nbytes)
        return out

    def zeros(self, shape: Sequence[int], dtype: Any) -> np.ndarray:
        out = super().zeros(shape, dtype)
        self._emit("alloc", "zeros", out.nbytes)
        return out

    def from_host(self, array: np.ndarray) -> np.ndarray:
        out = super().from_host(array)
        self._emit("alloc", "from_host", out.nbytes)
        self._emit("h2d", "from_host", out.nbytes)
        return out

    def copy_from_host(self, dst: np.ndarray, src: np.ndarray) -> None:
        if self._op_kind == "capture_node":
            self._emit("capture_node", "copy_from_host", dst.nbytes)
            return
        super().copy_from_host(dst, src)
        self._emit("h2d", "copy_from_host", dst.nbytes)

    def to_host(self, array: np.ndarray) -> np.ndarray:
        self._check_not_capturing("to_host()")
        self._emit("d2h", "to_host", array.nbytes)
        return super().to_host(array)

    def copy_to_host_async(self, dst: np.ndarray, src: np.ndarray) -> None:
        self._check_not_capturing("copy_to_host_async()")
        self._emit("d2h", "copy_to_host_async", src.nbytes)
        super().copy_to_host_async(dst, src)

    def to_host_async(self, array: np.ndarray) -> "_MockRead":
        """Snapshot ``array`` now (what a queued copy would see); ``d2h`` is recorded at
        ``wait()``, where a CUDA host would block."""
        self._check_not_capturing("to_host_async()")
        return _MockRead(self, np.array(array, copy=True))

    def copy_(self, dst: np.ndarray, src: np.ndarray) -> None:
        if self._op_kind == "capture_node":
            self._emit("capture_node", "copy_", dst.nbytes)
            return
        super().copy_(dst, src)
        self._emit("d2d", "copy_", dst.nbytes)

    def synchronize(self) -> None:
        self._check_not_capturing("synchronize()")
        self._emit("sync", "synchronize")

    def record_event(self) -> DeviceEvent:
        self._check_not_capturing("record_event()")
        self._emit("event", "record_event")
        return DeviceEvent()

    def reset_workspace(self) -> None:
        self._emit("reset_workspace", "reset_workspace")

    @property
    def supports_graphs(self) -> bool:
        return True

    def capture(self, fn: Callable[[], Any]) -> MockGraph:
        """Run ``fn`` once without touching device state, recording its ops as the graph's nodes."""
        start = len(self.events)
        with self._mode("capture_node"):
            fn()
        ops = [e.name for e in self.events[start:] if e.kind == "capture_node"
               and e.name in self.ops]
        self._emit("capture", f"{len(ops)} nodes")
        return MockGraph(self, fn, ops)
