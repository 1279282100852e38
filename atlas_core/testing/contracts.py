"""Contract test classes: subclass one in a plugin's tests to run the whole suite on it.

>>> class TestCudaBackend(GpuBackendContract):   # in plugins/atlas-cuda/tests/
...     backend_name = "cuda"                     # or override make_backend()
...     pytestmark = pytest.mark.gpu

:class:`GpuBackendContract` checks every registered op the backend has against its NumPy
reference (tolerances in :data:`~atlas_core.testing.contracts_ops.TOLERANCES`): every op spec
with contract cases, core's and plugins' alike, through
:class:`~atlas_core.testing.contracts_cases.GeneratedOpContract`; the KV-cache, attention,
sampling and guided ops and ``linear`` through hand-written tests that check more than a
reference comparison can; the KV tiers' block transfers (pinned host memory, async copies,
``gather_blocks`` / ``scatter_blocks`` under KVBlockIO); then the memory API and graph
capture. :class:`CommBackendContract` and :class:`StorageBackendContract` do the same for comm
and storage backends.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from atlas_core.ops._dtypes import bfloat16, float8_e4m3fn
from atlas_core.testing.contracts_attention import AttentionContract
from atlas_core.testing.contracts_cases import GeneratedOpContract, backend_registry
from atlas_core.testing.contracts_guided import GuidedContract
from atlas_core.testing.contracts_kv_nvfp4 import KVNvfp4Contract
from atlas_core.testing.contracts_kv_transfer import KVTransferContract
from atlas_core.testing.contracts_ops import OpContract
from atlas_core.testing.contracts_sampling import SamplingContract

MEMORY_DTYPES = [np.dtype(np.float32), bfloat16, np.dtype(np.float16), float8_e4m3fn,
                 np.dtype(np.int32), np.dtype(np.int64), np.dtype(np.uint64)]


def _create(kind: str, name: str | None, options: dict[str, Any]) -> Any:
    if name is None:
        raise NotImplementedError("set the class attribute naming the backend, or override the "
                                  "make_* classmethod")
    from atlas_core.plugins import Registry
    return Registry().create(kind, name, **options)


class GpuBackendContract(OpContract, AttentionContract, KVNvfp4Contract, SamplingContract,
                         GuidedContract, KVTransferContract, GeneratedOpContract):
    """Every op and the memory API of a GpuBackend. Set ``backend_name`` or override
    :meth:`make_backend`; ``backend_options`` are passed to the factory."""

    backend_name: str | None = None
    backend_options: dict[str, Any] = {}

    @classmethod
    def make_backend(cls) -> Any:
        return _create("gpu_backends", cls.backend_name, cls.backend_options)

    @pytest.fixture(scope="class")
    @classmethod
    def backend(cls):
        backend = cls.make_backend()
        yield backend
        backend.close()

    def test_every_op_has_a_test(self, backend):
        names = [n for n in dir(type(self)) if n.startswith("test_")]
        registry = backend_registry(backend)
        missing = [op for op in registry.names() if registry.spec(op).cases is None
                   and not any(n == f"test_{op}" or n.startswith(f"test_{op}_") for n in names)]
        assert not missing, f"ops with neither contract cases nor a contract test: {missing}"

    def test_device_and_memory_info(self, backend):
        info = backend.device_info()
        assert info.name and info.kind and info.total_memory > 0
        free, total = backend.memory_info()
        assert 0 < free <= total

    @pytest.mark.parametrize("dtype", MEMORY_DTYPES, ids=lambda d: d.name)
    def test_from_host_to_host_roundtrip(self, backend, dtype):
        host = (np.arange(60).reshape(3, 4, 5) % 17).astype(dtype)
        dev = backend.from_host(host)
        assert tuple(dev.shape) == host.shape and dev.dtype == dtype and dev.nbytes == host.nbytes
        host[...] = 0  # the device copy must not alias the host array
        back = backend.to_host(dev)
        assert isinstance(back, np.ndarray) and back.dtype == dtype
        np.testing.assert_array_equal(back.view(np.uint8),
                                      (np.arange(60).reshape(3, 4, 5) % 17).astype(dtype).view(np.uint8))

    def test_empty_and_zeros(self, backend):
        empty = backend.empty((3, 5), bfloat16)
        assert tuple(empty.shape) == (3, 5) and empty.dtype == bfloat16
        zeros = backend.zeros((4, 2, 3), np.int32)
        np.testing.assert_array_equal(backend.to_host(zeros), np.zeros((4, 2, 3), np.int32))

    def test_copies_views_and_reshape(self, backend):
        dev = backend.zeros((6, 4), np.float32)
        backend.copy_from_host(dev[1:3], np.ones((2, 4), np.float32))
        flat = dev.reshape(24)
        assert tuple(flat.shape) == (24,)
        backend.copy_from_host(flat[20:24].reshape(1, 4), np.full((1, 4), 7, np.float32))
        src = backend.from_host(np.arange(8, dtype=np.float32).reshape(2, 4))
        backend.copy_(dev[3:5], src)
        backend.synchronize()
        want = np.zeros((6, 4), np.float32)
        want[1:3], want[3:5], want[5] = 1, np.arange(8).reshape(2, 4), 7
        np.testing.assert_array_equal(backend.to_host(dev), want)
        np.testing.assert_array_equal(backend.to_host(flat), want.reshape(24))

    def test_graph_capture_and_replay(self, backend):
        x = backend.from_host(np.ones((4, 8), np.float32))
        out = backend.zeros((4, 8), np.float32)
        backend.reset_workspace()
        graph = backend.capture(lambda: backend.copy_(out, backend.ops.add(x, x)))
        backend.copy_from_host(x, np.full((4, 8), 3, np.float32))
        backend.reset_workspace()
        graph.replay()
        backend.synchronize()
        np.testing.assert_array_equal(backend.to_host(out), np.full((4, 8), 6, np.float32))


class CommBackendContract:
    """A CommBackend seen from one rank of a world of one. Set ``comm_name`` (and
    ``gpu_backend_name``) or override :meth:`make_comm` / :meth:`make_backend`."""

    comm_name: str | None = None
    comm_options: dict[str, Any] = {"rank": 0, "world_size": 1}
    gpu_backend_name: str = "numpy"

    @classmethod
    def make_comm(cls) -> Any:
        return _create("comm_backends", cls.comm_name, cls.comm_options)

    @classmethod
    def make_backend(cls) -> Any:
        return _create("gpu_backends", cls.gpu_backend_name, {})

    @pytest.fixture(scope="class")
    @classmethod
    def comm(cls):
        comm = cls.make_comm()
        yield comm
        comm.close()

    @pytest.fixture(scope="class")
    @classmethod
    def backend(cls):
        backend = cls.make_backend()
        yield backend
        backend.close()

    def test_rank_and_world(self, comm):
        assert comm.world_size == 1 and comm.rank == 0

    @pytest.mark.parametrize("op", ["sum", "max", "min"])
    def test_all_reduce(self, comm, backend, op):
        host = np.arange(12, dtype=np.float32).reshape(3, 4)
        np.testing.assert_array_equal(backend.to_host(comm.all_reduce(backend.from_host(host), op)), host)

    def test_all_gather(self, comm, backend):
        host = np.arange(6, dtype=np.float32).reshape(2, 3)
        for axis in (0, 1):
            out = backend.to_host(comm.all_gather(backend.from_host(host), axis=axis))
            np.testing.assert_array_equal(out, host)

    def test_all_to_all(self, comm, backend):
        host = np.arange(4, dtype=np.int32)
        try:
            out = comm.all_to_all([backend.from_host(host)])
        except NotImplementedError:
            pytest.skip("all_to_all is optional")
        assert len(out) == 1
        np.testing.assert_array_equal(backend.to_host(out[0]), host)
        rows = np.arange(6, dtype=np.float32).reshape(3, 2)
        try:
            counts = comm.all_to_all_rows([3])
            out = comm.all_to_all([backend.from_host(rows)], counts)
        except NotImplementedError:
            return  # all-to-all-v is optional too
        assert counts == [3]
        np.testing.assert_array_equal(backend.to_host(out[0]), rows)

    def test_barrier(self, comm):
        comm.barrier()


class StorageBackendContract:
    """A StorageBackend. Set ``storage_name`` or override :meth:`make_storage` (which gets
    pytest's ``tmp_path`` for file-backed stores)."""

    storage_name: str | None = None

    @classmethod
    def make_storage(cls, tmp_path) -> Any:
        return _create("storage_backends", cls.storage_name, {"root": str(tmp_path)})

    @pytest.fixture
    def storage(self, tmp_path):
        storage = type(self).make_storage(tmp_path)
        yield storage
        storage.close()

    def test_write_read_overwrite(self, storage):
        asyncio.run(storage.write("block-1", b"abc"))
        assert storage.contains("block-1")
        assert asyncio.run(storage.read("block-1")) == b"abc"
        asyncio.run(storage.write("block-1", bytes(range(256)) * 1000))
        assert asyncio.run(storage.read("block-1")) == bytes(range(256)) * 1000

    def test_missing_key_and_delete(self, storage):
        assert not storage.contains("nope")
        with pytest.raises(KeyError):
            asyncio.run(storage.read("nope"))
        asyncio.run(storage.write("k", b"x"))
        asyncio.run(storage.delete("k"))
        asyncio.run(storage.delete("k"))
        assert not storage.contains("k")

    def test_awkward_keys(self, storage):
        keys = ["a/b", "../escape", ".hidden", "Key", "key", "sp ace", "üñí", "a%2Fb"]
        for i, key in enumerate(keys):
            asyncio.run(storage.write(key, str(i).encode()))
        for i, key in enumerate(keys):
            assert asyncio.run(storage.read(key)) == str(i).encode()
        try:
            listed = storage.keys()
        except NotImplementedError:
            return
        assert sorted(listed) == sorted(keys)

    def test_concurrent_writes_and_used_bytes(self, storage):
        async def many():
            await asyncio.gather(*(storage.write(f"k{i}", bytes([i]) * 100) for i in range(20)))
            return await asyncio.gather(*(storage.read(f"k{i}") for i in range(20)))
        assert asyncio.run(many()) == [bytes([i]) * 100 for i in range(20)]
        assert storage.used_bytes() in (0, 2000)

    def test_read_into_a_given_buffer(self, storage):
        data = np.random.default_rng(7).integers(0, 255, 10_000, dtype=np.uint8)
        asyncio.run(storage.write("blk", memoryview(data)))
        raw = np.zeros(3 * 4096 + 4096, np.uint8)
        aligned = raw[-raw.ctypes.data % 4096:][:3 * 4096]   # page-aligned, whole pages
        assert asyncio.run(storage.read_into("blk", memoryview(aligned))) == data.nbytes
        np.testing.assert_array_equal(aligned[:data.nbytes], data)
        odd = np.zeros(data.nbytes + 3, np.uint8)[1:]        # unaligned, not whole pages
        assert asyncio.run(storage.read_into("blk", memoryview(odd))) == data.nbytes
        np.testing.assert_array_equal(odd[:data.nbytes], data)
        with pytest.raises(BufferError):
            asyncio.run(storage.read_into("blk", memoryview(np.zeros(9_999, np.uint8))))
        with pytest.raises(KeyError):
            asyncio.run(storage.read_into("nope", memoryview(aligned)))

    def test_bytes_like_data(self, storage):
        data = np.arange(10, dtype=np.int32)
        asyncio.run(storage.write("np", memoryview(data).cast("B")))
        assert asyncio.run(storage.read("np")) == data.tobytes()
