"""The cuda backend's ``record_event`` over a fake driver (no GPU): events answer ``query``
without blocking (``CUDA_ERROR_NOT_READY`` is "not yet", not an error), ``wait`` synchronizes
once and makes the context current on the waiting thread, and handles are reused, never
destroyed at garbage collection; timing events (``event`` / ``elapsed_ms``) are destroyed once
read."""

from __future__ import annotations

import enum
import threading
from types import SimpleNamespace

import pytest

from atlas_cuda import backend as backend_mod
from atlas_cuda import driver


class _Result(enum.Enum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_NOT_READY = 600


class _FakeDriver:
    CUresult = _Result
    CUevent_flags = SimpleNamespace(CU_EVENT_DISABLE_TIMING=2)

    def __init__(self) -> None:
        self.created, self.ready, self.calls = 0, set(), []

    def cuEventCreate(self, flags):
        self.created += 1
        return _Result.CUDA_SUCCESS, f"ev{self.created}"

    def cuEventRecord(self, handle, stream):
        self.ready.discard(handle)
        self.calls.append(("record", handle))
        return (_Result.CUDA_SUCCESS,)

    def cuEventQuery(self, handle):
        self.calls.append(("query", handle))
        return (_Result.CUDA_SUCCESS if handle in self.ready else _Result.CUDA_ERROR_NOT_READY,)

    def cuEventSynchronize(self, handle):
        self.calls.append(("sync", handle))
        self.ready.add(handle)
        return (_Result.CUDA_SUCCESS,)

    def cuGetErrorName(self, err):
        return _Result.CUDA_SUCCESS, err.name.encode()


@pytest.fixture
def fake(monkeypatch):
    drv = _FakeDriver()
    monkeypatch.setattr(driver, "drv", lambda: drv)
    monkeypatch.setattr(backend_mod, "drv", lambda: drv)
    be = backend_mod.CudaBackend.__new__(backend_mod.CudaBackend)
    be.stream, be._free_events, be.current_on = 7, [], []
    be.ensure_current = lambda: be.current_on.append(threading.current_thread().name)
    return drv, be


def test_query_never_blocks_and_wait_synchronizes_once(fake):
    drv, be = fake
    event = be.record_event()
    assert not event.query() and ("sync", "ev1") not in drv.calls
    thread = threading.Thread(target=event.wait, name="atlas-kv-checksum_0")
    thread.start()
    thread.join()
    assert "atlas-kv-checksum_0" in be.current_on            # context made current there
    assert event.query() and drv.calls.count(("sync", "ev1")) == 1
    event.wait()
    assert drv.calls.count(("sync", "ev1")) == 1


def test_handles_are_reused_after_the_last_reference_goes(fake):
    drv, be = fake
    first = be.record_event()
    second = be.record_event()
    assert (first.handle, second.handle) == ("ev1", "ev2")
    del first
    assert be._free_events == ["ev1"]
    third = be.record_event()
    assert third.handle == "ev1" and drv.created == 2 and not be._free_events
    assert drv.calls[-1] == ("record", "ev1")


def test_timing_events_are_destroyed_once_read(fake, monkeypatch):
    """``event()`` / ``elapsed_ms``: each timing pair is destroyed after its one read (a
    200-replay timing loop used to leave 400 events behind), also when the read fails."""
    drv, be = fake
    destroyed = []
    drv.CUevent_flags = SimpleNamespace(CU_EVENT_DEFAULT=0)
    monkeypatch.setattr(drv, "cuEventDestroy",
                        lambda h: destroyed.append(h) or (_Result.CUDA_SUCCESS,), raising=False)
    monkeypatch.setattr(drv, "cuEventElapsedTime", lambda a, b: (_Result.CUDA_SUCCESS, 2.5),
                        raising=False)
    start, end = be.event(), be.event()
    assert be.elapsed_ms(start, end) == 2.5 and destroyed == [start, end]
    monkeypatch.setattr(drv, "cuEventElapsedTime",
                        lambda a, b: (_Result.CUDA_ERROR_NOT_READY, None))
    start, end = be.event(), be.event()
    with pytest.raises(driver.CudaError, match="CUDA_ERROR_NOT_READY"):
        be.elapsed_ms(start, end)
    assert destroyed[2:] == [start, end]
