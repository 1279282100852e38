"""Built-in comm and storage backends pass their contracts; posix-specific behaviour."""

import asyncio
import os

import pytest

from atlas_core.comm.loopback import LoopbackComm
from atlas_core.storage.memory import MemoryStorage
from atlas_core.storage.posix import PosixStorage, filename_to_key, key_to_filename
from atlas_core.testing.contracts import (CommBackendContract, StorageBackendContract)


class TestLoopbackComm(CommBackendContract):
    comm_name = "loopback"


class TestLoopbackCommOnMock(CommBackendContract):
    comm_name = "loopback"
    gpu_backend_name = "mock"


class TestMemoryStorage(StorageBackendContract):
    storage_name = "memory"


class TestPosixStorage(StorageBackendContract):
    storage_name = "posix"


def test_loopback_rejects_other_worlds():
    with pytest.raises(ValueError, match="single rank"):
        LoopbackComm(rank=1, world_size=2)
    with pytest.raises(ValueError, match="all_reduce op"):
        LoopbackComm().all_reduce(1, op="avg")


def test_posix_files_stay_inside_root(tmp_path):
    store = PosixStorage(root=tmp_path / "kv")
    asyncio.run(store.write("../../etc/passwd", b"x"))
    asyncio.run(store.write("Abc", b"y"))
    names = sorted(os.listdir(tmp_path / "kv"))
    assert names == sorted(key_to_filename(k) for k in ["../../etc/passwd", "Abc"])
    assert all("/" not in n and not n.startswith(".") for n in names)
    assert os.listdir(tmp_path) == ["kv"]


def test_posix_write_is_atomic_and_leaves_no_temp_files(tmp_path, monkeypatch):
    store = PosixStorage(root=tmp_path)
    asyncio.run(store.write("k", b"old"))

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError):
        asyncio.run(store.write("k", b"new"))
    monkeypatch.undo()
    assert asyncio.run(store.read("k")) == b"old"
    assert os.listdir(tmp_path) == ["k"]


def test_key_encoding_roundtrip_and_limits():
    for key in ["abc", "A/b", "%", "ü", ".", "..", "x-y_z"]:
        assert filename_to_key(key_to_filename(key)) == key
    with pytest.raises(ValueError, match="non-empty"):
        key_to_filename("")
    with pytest.raises(ValueError, match="too long"):
        key_to_filename("x" * 300)


def test_memory_storage_used_bytes():
    store = MemoryStorage()
    asyncio.run(store.write("a", b"1234"))
    asyncio.run(store.write("b", b"56"))
    assert store.used_bytes() == 6 and store.keys() == ["a", "b"]
