"""The nccl CommBackend against a fake nccl4py (the real one needs GPUs): what it sends to
NCCL (raw pointers, counts, data types, the backend's stream), the unique-id exchange, the
init timeout and abort, the errors that say what to install or use instead, and how the
peer-memory all-reduce is agreed on or left out."""

import enum
import sys
import threading
import types

import numpy as np
import pytest

from atlas_core.api import Registry, bfloat16
from atlas_nccl.comm import UNIQUE_ID_KEY, NcclComm, NcclError

STREAM = 0x5000


class _DataType(enum.IntEnum):
    INT8, UINT8, INT32, UINT32, INT64, UINT64, FLOAT16, FLOAT32, FLOAT64, BFLOAT16 = range(10)


class _RedOp(enum.IntEnum):
    SUM, PROD, MAX, MIN, AVG = range(5)


class _Array:
    _next = 0x1000

    def __init__(self, shape, dtype=np.float32):
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        self.size = int(np.prod(self.shape))
        self.ptr = _Array._next
        _Array._next += 0x1000


class _Backend:
    stream = STREAM

    def __init__(self):
        self.ctx = types.SimpleNamespace(out=lambda shape, dtype: _Array(shape, dtype))

    def zeros(self, shape, dtype):
        return _Array(shape, dtype)

    def synchronize(self):
        pass


class _Store(dict):
    def set(self, key, value):
        self[key] = value

    def get(self, key, timeout=None):
        return self[key]


@pytest.fixture()
def fake_nccl(monkeypatch):
    monkeypatch.setenv("ATLAS_P2P_ALLREDUCE", "0")  # the peer-memory path: its own tests below
    calls = []
    block = threading.Event()
    block.set()

    class Communicator:
        ptr = 0xC0FFEE

        @classmethod
        def init(cls, nranks, rank, unique_id):
            block.wait()
            calls.append(("init", nranks, rank, unique_id.raw))
            return cls()

        def abort(self):
            calls.append(("abort",))

        def destroy(self):
            calls.append(("destroy",))

    class UniqueId:
        def __init__(self, raw):
            self.raw = raw

        @property
        def as_bytes(self):
            return self.raw

        @staticmethod
        def from_bytes(raw):
            return UniqueId(raw)

    def record(name):
        return lambda *args: calls.append((name, *args))

    core = types.ModuleType("nccl.core")
    core.Communicator, core.UniqueId = Communicator, UniqueId
    core.get_unique_id = lambda: UniqueId(b"id-of-rank-0")
    core.NcclDataType, core.NcclRedOp = _DataType, _RedOp
    bindings = types.ModuleType("nccl.bindings.nccl")
    for name in ("all_reduce", "all_gather", "reduce_scatter", "send", "recv", "group_start",
                 "group_end"):
        setattr(bindings, name, record(name))
    package, parent = types.ModuleType("nccl"), types.ModuleType("nccl.bindings")
    package.core, package.bindings, parent.nccl = core, parent, bindings
    monkeypatch.setitem(sys.modules, "nccl", package)
    monkeypatch.setitem(sys.modules, "nccl.core", core)
    monkeypatch.setitem(sys.modules, "nccl.bindings", parent)
    monkeypatch.setitem(sys.modules, "nccl.bindings.nccl", bindings)
    return types.SimpleNamespace(calls=calls, block=block)


def test_unique_id_goes_through_the_store(fake_nccl):
    store = _Store()
    NcclComm(0, 2, store=store, backend=_Backend())
    assert store[UNIQUE_ID_KEY] == b"id-of-rank-0"
    NcclComm(1, 2, store=store, backend=_Backend())
    assert [c for c in fake_nccl.calls if c[0] == "init"] == [
        ("init", 2, 0, b"id-of-rank-0"), ("init", 2, 1, b"id-of-rank-0")]


def test_collectives_pass_raw_pointers_on_the_backend_stream(fake_nccl):
    comm = NcclComm(0, 2, store=_Store(), backend=_Backend())
    fake_nccl.calls.clear()
    x = _Array((3, 4), bfloat16)
    assert comm.all_reduce(x) is x
    assert fake_nccl.calls[-1] == ("all_reduce", x.ptr, x.ptr, 12, _DataType.BFLOAT16,
                                   _RedOp.SUM, 0xC0FFEE, STREAM)
    gathered = comm.all_gather(x)
    assert gathered.shape == (6, 4)
    assert fake_nccl.calls[-1] == ("all_gather", x.ptr, gathered.ptr, 12, _DataType.BFLOAT16,
                                   0xC0FFEE, STREAM)
    part = comm.reduce_scatter(_Array((4, 2)), "max")
    assert part.shape == (2, 2) and fake_nccl.calls[-1][3:6] == (4, _DataType.FLOAT32, _RedOp.MAX)
    got = comm.all_to_all([_Array((2,), np.int32), _Array((2,), np.int32)])
    assert [c[0] for c in fake_nccl.calls[-6:]] == ["group_start", "send", "recv", "send",
                                                     "recv", "group_end"]
    assert [g.shape for g in got] == [(2,), (2,)]


def test_all_to_all_v_sizes_each_receive_and_skips_empty_pairs(fake_nccl):
    """recv_rows: each receive buffer has the rows the peer sends; a pair with nothing to send
    or receive issues no NCCL call (both sides skip it alike)."""
    comm = NcclComm(0, 2, store=_Store(), backend=_Backend())
    fake_nccl.calls.clear()
    send = [_Array((0, 4), bfloat16), _Array((3, 4), bfloat16)]
    got = comm.all_to_all(send, recv_rows=[0, 5])
    assert [g.shape for g in got] == [(0, 4), (5, 4)]
    assert [c[0] for c in fake_nccl.calls] == ["group_start", "send", "recv", "group_end"]
    assert fake_nccl.calls[1][1:5] == (send[1].ptr, 12, _DataType.BFLOAT16, 1)
    assert fake_nccl.calls[2][1:5] == (got[1].ptr, 20, _DataType.BFLOAT16, 1)
    with pytest.raises(ValueError, match="one row shape and dtype for every array"):
        comm.all_to_all([_Array((1, 4)), _Array((1, 3))], recv_rows=[1, 1])


def test_bad_requests_say_what_to_do(fake_nccl):
    comm = NcclComm(0, 2, store=_Store(), backend=_Backend())
    with pytest.raises(ValueError, match="axis 0 only"):
        comm.all_gather(_Array((2, 2)), axis=1)
    with pytest.raises(ValueError, match="unsupported reduce op 'median'"):
        comm.all_reduce(_Array((2,)), "median")
    with pytest.raises(NcclError, match="no data type for complex64"):
        comm.all_reduce(_Array((2,), np.complex64))
    with pytest.raises(NcclError, match="runs on the cuda GpuBackend"):
        NcclComm(0, 2, store=_Store(), backend=object())


def test_init_that_never_completes_times_out(fake_nccl):
    fake_nccl.block.clear()
    with pytest.raises(NcclError, match="not every rank joined .* within 0 s"):
        NcclComm(0, 2, store=_Store(), backend=_Backend(), timeout=0.2)
    fake_nccl.block.set()


def test_abort_ends_the_communicator(fake_nccl):
    comm = NcclComm(0, 2, store=_Store(), backend=_Backend())
    comm.abort()
    assert ("abort",) in fake_nccl.calls
    with pytest.raises(NcclError, match="aborted or closed"):
        comm.all_reduce(_Array((2,)))
    comm.close()


def test_missing_nccl4py_names_the_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "nccl.core", None)
    with pytest.raises(NcclError, match=r"pip install 'atlas-nccl\[nccl\]'"):
        NcclComm(0, 1, backend=_Backend())


def test_registered_lazily():
    registry = Registry()
    assert "nccl" in registry.names("comm_backends")
    assert "nccl.core" not in sys.modules or not hasattr(sys.modules["nccl.core"], "Communicator")


def test_passes_the_bindings_communicator_object_when_nccl4py_has_one(fake_nccl):
    comm = NcclComm(0, 2, store=_Store(), backend=_Backend())
    native = object()
    comm._comm._comm = native
    x = _Array((2,))
    comm.all_reduce(x)
    assert fake_nccl.calls[-1][6] is native


class _HostBackend(_Backend):
    """A backend whose arrays hold values (for the ranks' agreement all-reduce)."""

    def from_host(self, a):
        arr = _Array(a.shape, a.dtype)
        arr.value = a.copy()
        return arr

    def to_host(self, arr):
        return arr.value


def test_peer_memory_all_reduce_is_agreed_and_falls_back_to_nccl(fake_nccl, monkeypatch):
    """Without a device the shared buffer cannot be made: the rank publishes an empty value (so
    peers do not wait for it), takes part in the agreement all-reduce (min) and uses NCCL."""
    monkeypatch.setenv("ATLAS_P2P_ALLREDUCE", "1")
    store = _Store()
    comm = NcclComm(0, 2, store=store, backend=_HostBackend())
    assert comm._p2p is None and store["nccl/p2p/0"] == b""
    assert [c[0] for c in fake_nccl.calls if c[0] == "all_reduce"] == ["all_reduce"]
    assert fake_nccl.calls[-1][5] == _RedOp.MIN
    x = _Array((2, 8), bfloat16)
    comm.all_reduce(x)
    assert fake_nccl.calls[-1][:2] == ("all_reduce", x.ptr)


def test_peer_memory_all_reduce_off_by_environment(fake_nccl, monkeypatch):
    from atlas_nccl import p2p
    monkeypatch.setenv("ATLAS_P2P_ALLREDUCE", "1")
    monkeypatch.setenv("NCCL_P2P_DISABLE", "1")
    assert not p2p.enabled()
    store = _Store()
    comm = NcclComm(0, 2, store=store, backend=_HostBackend())
    assert comm._p2p is None and "nccl/p2p/0" not in store
    assert not [c for c in fake_nccl.calls if c[0] == "all_reduce"]
    monkeypatch.setenv("ATLAS_P2P_ALLREDUCE_MAX_KB", "64")
    assert p2p.max_bytes() == 64 << 10


def test_peer_memory_all_reduce_takes_small_sums_only():
    from atlas_nccl.p2p import P2pAllReduce
    p2p = P2pAllReduce.__new__(P2pAllReduce)
    p2p.limit = 1 << 20
    small = _Array((1, 4096), bfloat16)
    small.nbytes = 8192
    assert p2p.takes(small, "sum") and not p2p.takes(small, "max")
    big = _Array((256, 4096), np.float32)
    big.nbytes = 256 * 4096 * 4
    assert not p2p.takes(big, "sum")
    odd = _Array((3,), np.float32)
    odd.nbytes = 12
    assert not p2p.takes(odd, "sum")
    ints = _Array((8,), np.int32)
    ints.nbytes = 32
    assert not p2p.takes(ints, "sum")


def test_peer_memory_all_reduce_mode_from_environment(monkeypatch):
    from atlas_nccl import p2p
    monkeypatch.delenv("ATLAS_P2P_ALLREDUCE_MODE", raising=False)
    assert p2p.mode() == "push"
    monkeypatch.setenv("ATLAS_P2P_ALLREDUCE_MODE", " Pull ")
    assert p2p.mode() == "pull"
    monkeypatch.setenv("ATLAS_P2P_ALLREDUCE_MODE", "")
    assert p2p.mode() == "push"
    monkeypatch.setenv("ATLAS_P2P_ALLREDUCE_MODE", "LL")
    assert p2p.mode() == "ll"
    monkeypatch.setenv("ATLAS_P2P_ALLREDUCE_MODE", "pool")
    with pytest.raises(ValueError, match="pull, push, ll"):
        p2p.mode()


@pytest.mark.parametrize("kb", [16, 64, 100, 1024, 3000])
def test_peer_memory_buffer_holds_every_block_slice(kb):
    """Every tensor the path takes gives each block at most one region of vectors (the kernel
    traps otherwise), and a slot holds world x the largest tensor: push lands every rank's."""
    from atlas_nccl import p2p
    limit = kb << 10
    region = p2p.region_bytes(limit)
    assert region % 16 == 0
    nvec = np.arange(1, limit // 16 + 1)
    blocks = np.maximum(1, np.minimum(p2p.MAX_BLOCKS, -(-nvec // p2p.THREADS)))
    step = max(1, len(nvec) // 997)
    assert [p2p.grid(int(n)) for n in nvec[::step]] == blocks[::step].tolist()
    assert (-(-nvec // blocks) * 16 <= region).all()
    # ll: two 16-byte lines a vector, for every tensor up to LL_MAX_BYTES
    ll_nvec = nvec[nvec <= p2p.LL_MAX_BYTES // 16]
    ll_blocks = blocks[:len(ll_nvec)]
    assert (-(-ll_nvec // ll_blocks) * 32 <= p2p.ll_region_bytes()).all()
    for world in (2, 4, 8):
        slot = world * p2p.MAX_BLOCKS * region
        assert slot >= world * limit
        ll_area = 2 * world * p2p.MAX_BLOCKS * p2p.ll_region_bytes()
        assert p2p.ll_base(limit, world) == p2p.HEADER + 2 * slot
        assert p2p.buffer_bytes(limit, world) == p2p.HEADER + 2 * slot + ll_area
    # the default: push / pull waste nothing; the ll area is 1 MiB a peer
    assert p2p.buffer_bytes(1 << 20, 2) == p2p.HEADER + 4 * (1 << 20) + 2 * (1 << 20)


@pytest.mark.parametrize("mode, nbytes, kernel", [
    ("ll", 8 << 10, "p2p_allreduce_ll"), ("ll", 64 << 10, "p2p_allreduce_ll"),
    ("ll", (64 << 10) + 16, "p2p_allreduce_push"), ("push", 8 << 10, "p2p_allreduce_push"),
    ("pull", 8 << 10, "p2p_allreduce")])
def test_peer_memory_all_reduce_kernel_per_call(mode, nbytes, kernel):
    """ll takes tensors up to LL_MAX_BYTES with its own area, push the larger ones; the other
    modes keep their kernel and region."""
    from types import SimpleNamespace

    from atlas_nccl import p2p

    launches = []
    ctx = SimpleNamespace(pdl=True, kernel=lambda module, dtype, name: name,
                          launch=lambda k, grid, block, *args, pdl: launches.append((k, args)))
    backend = SimpleNamespace(ctx=ctx, from_host=lambda a: a)
    comm = SimpleNamespace(backend=backend, rank=1, world_size=2, timeout=1.0)
    ar = p2p.P2pAllReduce(comm, None, [], [0, 0], 1 << 20, mode)
    array = SimpleNamespace(ptr=0, nbytes=nbytes, dtype=np.dtype(np.float32))
    ar.all_reduce(array)
    (name, args), = launches
    assert name == kernel
    nvec = nbytes // 16
    if kernel.endswith("_ll"):
        assert args[4:7] == (nvec, p2p.ll_base(1 << 20, 2), p2p.ll_region_bytes())
    else:
        assert args[4:6] == (nvec, p2p.region_bytes(1 << 20))
