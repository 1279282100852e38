"""The rendezvous store and the ``cpu`` CommBackend, across real processes."""

import multiprocessing
import time

import numpy as np
import pytest

from atlas_core.parallel.cpu_comm import CommTimeoutError, CpuComm
from atlas_core.parallel.store import StoreClient, StoreServer
from atlas_core.plugins import Registry
from atlas_core.testing.contracts import CommBackendContract


def _collectives(rank, port, out):
    comm = CpuComm(rank, 2, store=StoreClient("127.0.0.1", port, 20), timeout=20)
    x = np.arange(6, dtype=np.float32).reshape(3, 2) * (rank + 1)
    results = {
        "sum": comm.all_reduce(x.copy()),
        "max": comm.all_reduce(np.array([rank, 5 - rank], np.float32), "max"),
        "gather": comm.all_gather(np.full((1, 2), rank, np.int32)),
        "scatter": comm.reduce_scatter(np.arange(4, dtype=np.float32) + rank),
        "a2a": comm.all_to_all([np.array([10 * rank + d]) for d in range(2)]),
    }
    # all-to-all-v: rank r sends rank d (r + d) rows of value 10 r + d, two columns
    send = [np.full((rank + d, 2), 10 * rank + d, np.int32) for d in range(2)]
    results["a2av_rows"] = comm.all_to_all_rows([len(a) for a in send])
    results["a2av"] = comm.all_to_all(send, results["a2av_rows"])
    if rank == 0:
        comm.send(np.array([7.0]), 1)
    else:
        results["recv"] = comm.recv(np.zeros(1), 0)
    comm.barrier()
    out.put((rank, results))
    comm.close()


def _die_after_connect(rank, port):
    comm = CpuComm(rank, 2, store=StoreClient("127.0.0.1", port, 20), timeout=20)
    if rank == 1:
        raise SystemExit(0)
    comm.all_reduce(np.ones(2, np.float32))


@pytest.fixture()
def store():
    server = StoreServer()
    yield server
    server.close()


def test_store_set_get_and_timeout(store):
    a, b = StoreClient("127.0.0.1", store.port, 5), StoreClient("127.0.0.1", store.port, 5)
    a.set("uid", b"\x01\x02")
    assert b.get("uid") == b"\x01\x02"
    store.put("engine_addr", ("h", 1))
    assert a.get("engine_addr") == ("h", 1) and store.peek("missing") is None
    with pytest.raises(TimeoutError, match="no rank published 'late'"):
        b.get("late", timeout=0.2)


def test_collectives_across_two_processes(store):
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_collectives, args=(r, store.port, out)) for r in range(2)]
    for p in procs:
        p.start()
    got = dict(out.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(10)
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    for rank in range(2):
        r = got[rank]
        np.testing.assert_array_equal(r["sum"], 3 * x)
        np.testing.assert_array_equal(r["max"], [1, 5])
        np.testing.assert_array_equal(r["gather"], [[0, 0], [1, 1]])
        np.testing.assert_array_equal(r["scatter"], (2 * np.arange(4) + 1)[2 * rank:2 * rank + 2])
        assert [int(a[0]) for a in r["a2a"]] == [rank, 10 + rank]
        assert r["a2av_rows"] == [rank, 1 + rank]
        for src, part in enumerate(r["a2av"]):
            np.testing.assert_array_equal(part, np.full((src + rank, 2), 10 * src + rank))
    np.testing.assert_array_equal(got[1]["recv"], [7.0])


def test_dead_peer_fails_the_collective_fast(store):
    ctx = multiprocessing.get_context("spawn")
    peer = ctx.Process(target=_die_after_connect, args=(1, store.port))
    peer.start()
    comm = CpuComm(0, 2, store=StoreClient("127.0.0.1", store.port, 20), timeout=20)
    peer.join(20)
    start = time.monotonic()
    with pytest.raises(CommTimeoutError, match="rank 1"):
        comm.all_reduce(np.ones(2, np.float32))
    assert time.monotonic() - start < 5


def test_cpu_comm_is_registered_and_single_rank_is_identity():
    comm = Registry().create("comm_backends", "cpu", rank=0, world_size=1)
    x = np.ones(3, np.float32)
    assert comm.all_reduce(x) is x and comm.all_gather(x) is x
    with pytest.raises(ValueError, match="needs a rendezvous store"):
        CpuComm(0, 2)
    with pytest.raises(ValueError, match="unsupported all_reduce op 'avg'"):
        comm.all_reduce(x, "avg")
    assert comm.all_to_all_rows([3]) == [3]


class TestCpuCommContract(CommBackendContract):
    comm_name = "cpu"


def test_step_watchdog_aborts_the_comm_and_exits(monkeypatch):
    from atlas_core.parallel import worker
    exits, aborted = [], []
    monkeypatch.setattr(worker.os, "_exit", exits.append)
    comm = type("Comm", (), {"abort": lambda self: aborted.append(True)})()
    dog = worker._Watchdog(0, comm, timeout=0.2)
    time.sleep(0.3)
    assert not exits
    dog.deadline = time.monotonic() + 0.1
    deadline = time.monotonic() + 5
    while not exits and time.monotonic() < deadline:
        time.sleep(0.05)
    assert aborted == [True] and exits == [3]


def test_step_watchdog_does_not_count_kernel_compiles(monkeypatch):
    """A fresh machine's first steps compile kernels for a minute or more: the deadline moves
    by the compile seconds, and a step stuck after its compile still ends the rank."""
    from atlas_core.parallel import worker
    exits, compiled = [], [0.0]
    monkeypatch.setattr(worker.os, "_exit", exits.append)
    comm = type("Comm", (), {"abort": lambda self: None})()
    dog = worker._Watchdog(0, comm, timeout=0.3, busy=lambda: compiled[0])
    dog.arm()
    for _ in range(8):  # 0.8 s of "compiling" in a 0.3 s step budget
        compiled[0] += 0.1
        time.sleep(0.1)
    assert not exits
    deadline = time.monotonic() + 5
    while not exits and time.monotonic() < deadline:
        time.sleep(0.05)
    assert exits == [3]


def test_close_sends_what_is_queued_first(store, monkeypatch):
    # A rank that finished a collective closed its sockets while its own contribution still
    # sat in the sender thread's queue: the peer saw "rank 1 closed the connection" (flaky in
    # CI). A slow send makes that race certain.
    import threading

    from atlas_core.parallel import cpu_comm

    real_send = cpu_comm.Channel.send

    def slow_send(self, item):
        time.sleep(0.2)
        return real_send(self, item)

    made = {}
    thread = threading.Thread(target=lambda: made.setdefault(
        1, CpuComm(1, 2, store=StoreClient("127.0.0.1", store.port, 10), timeout=10)))
    thread.start()
    first = CpuComm(0, 2, store=StoreClient("127.0.0.1", store.port, 10), timeout=10)
    thread.join(10)
    monkeypatch.setattr(cpu_comm.Channel, "send", slow_send)
    made[1].send(np.array([7.0]), 0)
    made[1].close()
    np.testing.assert_array_equal(first.recv(np.zeros(1), 1), [7.0])
    first.close()
