"""The ``nccl`` CommBackend: collectives between GPUs through NVIDIA's nccl4py (no torch).

Every collective is issued on the cuda backend's stream with raw device pointers
(``nccl.bindings``), so it is ordered with the kernels around it and is captured into the
decode CUDA graphs like any of them. In-place where the result has the input's shape
(all-reduce); outputs of other shapes come from the backend's step workspace.

Rank 0 makes the NCCL unique id and publishes it through the rendezvous store; the others
read it there. A dead peer leaves NCCL waiting inside a kernel: :meth:`abort` (called by the
worker's step watchdog, from another thread) ends it, and :meth:`close` destroys the
communicator. nccl4py is imported only when a communicator is built.
"""

from __future__ import annotations

import importlib
import threading
from typing import Any

import numpy as np

from atlas_core.api import CommBackend

#: NumPy dtype name -> NCCL ``DataType`` member name.
DATATYPES = {"float32": "FLOAT32", "float16": "FLOAT16", "bfloat16": "BFLOAT16",
             "float64": "FLOAT64", "int8": "INT8", "uint8": "UINT8", "int32": "INT32",
             "uint32": "UINT32", "int64": "INT64", "uint64": "UINT64",
             "float8_e4m3fn": "FLOAT8E4M3", "float8_e5m2": "FLOAT8E5M2"}
REDUCE_OPS = {"sum": "SUM", "max": "MAX", "min": "MIN", "prod": "PROD", "avg": "AVG"}
UNIQUE_ID_KEY = "nccl/unique_id"


class NcclError(RuntimeError):
    """NCCL could not be set up or a collective failed (the message says what to check)."""


def import_nccl() -> Any:
    """``nccl.core`` of nccl4py, or :class:`NcclError` saying how to install it."""
    try:
        return importlib.import_module("nccl.core")
    except ImportError as exc:
        raise NcclError(f"the nccl comm backend needs nccl4py ({exc}): pip install "
                        "'atlas-nccl[nccl]' (nccl4py-cu12 / nccl4py-cu13 match your CUDA)") from None


class NcclComm(CommBackend):
    """One rank of an NCCL communicator over the devices of the cuda backend.

    Args:
        rank, world_size: this rank and the number of ranks.
        store: the rendezvous store (``set`` / ``get``) the unique id travels through.
        backend: this rank's cuda backend (its ``stream`` and step workspace ``ctx.out``).
        timeout: seconds to wait for the unique id and for every rank to join.
        **options: other factory options are ignored.
    """

    def __init__(self, rank: int = 0, world_size: int = 1, *, store: Any = None,
                 backend: Any = None, timeout: float = 300.0, **options: Any) -> None:
        if backend is None or not hasattr(backend, "stream"):
            raise NcclError("the nccl comm backend runs on the cuda GpuBackend (--backend cuda); "
                            "on the numpy backend use the cpu comm backend")
        if world_size > 1 and store is None:
            raise NcclError("the nccl comm backend needs a rendezvous store for the unique id")
        self.rank, self.world_size = rank, world_size
        self.backend, self.timeout = backend, timeout
        self._nccl = import_nccl()
        # nccl4py 0.6: the enums are nccl.core's NcclDataType / NcclRedOp, the calls on raw
        # pointers and streams are nccl.bindings.nccl's (what nccl.core's Communicator uses)
        self._b = importlib.import_module("nccl.bindings.nccl")
        types, ops = self._nccl.NcclDataType, self._nccl.NcclRedOp
        self._dtypes = {name: int(getattr(types, member))
                        for name, member in DATATYPES.items() if hasattr(types, member)}
        self._ops = {name: int(getattr(ops, member)) for name, member in REDUCE_OPS.items()}
        self._comm = self._init(store)
        self._p2p = None
        if world_size > 1:
            from atlas_nccl.p2p import P2pAllReduce
            self._p2p = P2pAllReduce.create(self, store)

    def _init(self, store: Any) -> Any:
        nccl = self._nccl
        if self.rank == 0:
            uid = nccl.get_unique_id()
            if store is not None:
                store.set(UNIQUE_ID_KEY, uid.as_bytes)
        else:
            uid = nccl.UniqueId.from_bytes(store.get(UNIQUE_ID_KEY, self.timeout))
        made: dict[str, Any] = {}

        def create() -> None:
            try:
                device = getattr(self.backend, "device", None)
                if device is not None:
                    device.set_current()  # the CUDA context is per thread
                made["comm"] = nccl.Communicator.init(nranks=self.world_size, rank=self.rank,
                                                      unique_id=uid)
            except Exception as exc:  # noqa: BLE001 - re-raised below with the rank
                made["error"] = exc

        thread = threading.Thread(target=create, name="atlas-nccl-init", daemon=True)
        thread.start()
        thread.join(self.timeout)
        if thread.is_alive():
            raise NcclError(f"rank {self.rank}: not every rank joined the NCCL communicator "
                            f"within {self.timeout:.0f} s (a peer failed to start, or NCCL cannot "
                            "reach it: check NCCL_SOCKET_IFNAME and the firewall)")
        if "error" in made:
            raise NcclError(f"rank {self.rank}: NCCL communicator init failed: "
                            f"{made['error']}") from made["error"]
        return made["comm"]

    def _dtype(self, array: Any) -> int:
        name = np.dtype(array.dtype).name
        if name not in self._dtypes:
            raise NcclError(f"NCCL has no data type for {name}")
        return self._dtypes[name]

    def _op(self, op: str) -> int:
        if op not in self._ops:
            raise ValueError(f"unsupported reduce op {op!r}; use one of {', '.join(self._ops)}")
        return self._ops[op]

    def _out(self, shape: tuple[int, ...], dtype: Any) -> Any:
        return self.backend.ctx.out(shape, dtype)

    @property
    def _handle(self) -> Any:
        """What ``nccl.bindings`` takes as the communicator: the bindings' ``Comm`` object
        (nccl4py 0.6), else the raw ``ncclComm_t`` pointer (earlier releases)."""
        if self._comm is None:
            raise NcclError(f"rank {self.rank}: the communicator was aborted or closed")
        inner = getattr(self._comm, "_comm", None)
        return inner if inner is not None and not isinstance(inner, int) else int(self._comm.ptr)

    def all_reduce(self, array: Any, op: str = "sum") -> Any:
        """Reduce ``array`` across ranks in place; returns it. Small sums between GPUs of one
        host take the peer-memory kernel (:mod:`atlas_nccl.p2p`), the rest NCCL."""
        if self.world_size > 1 and array.size:
            if self._p2p is not None and self._p2p.takes(array, op):
                return self._p2p.all_reduce(array)
            self.nccl_all_reduce(array, op)
        return array

    def nccl_all_reduce(self, array: Any, op: str = "sum") -> Any:
        """:meth:`all_reduce` through NCCL always."""
        if self.world_size > 1 and array.size:
            self._b.all_reduce(array.ptr, array.ptr, array.size, self._dtype(array),
                               self._op(op), self._handle, self.backend.stream)
        return array

    def all_gather(self, array: Any, axis: int = 0) -> Any:
        """Every rank's ``array`` stacked along axis 0 (``[world_size * n, ...]``)."""
        if axis != 0:
            raise ValueError("the nccl comm backend gathers along axis 0 only (contiguous "
                             "blocks); gather then reorder with an op")
        if self.world_size == 1:
            return array
        out = self._out((self.world_size * array.shape[0], *array.shape[1:]), array.dtype)
        self._b.all_gather(array.ptr, out.ptr, array.size, self._dtype(array), self._handle,
                           self.backend.stream)
        return out

    def reduce_scatter(self, array: Any, op: str = "sum") -> Any:
        """Reduce ``array`` ``[world_size * n, ...]``; returns this rank's ``n`` rows."""
        if array.shape[0] % self.world_size:
            raise ValueError(f"reduce_scatter needs a first axis divisible by {self.world_size}, "
                             f"got {array.shape}")
        out = self._out((array.shape[0] // self.world_size, *array.shape[1:]), array.dtype)
        self._b.reduce_scatter(array.ptr, out.ptr, out.size, self._dtype(array), self._op(op),
                               self._handle, self.backend.stream)
        return out

    def all_to_all(self, arrays: list[Any], recv_rows: list[int] | None = None) -> list[Any]:
        """Send ``arrays[r]`` to rank r; returns what each rank sent here: arrays of the shape
        sent (every rank sending one shape), or with ``recv_rows`` (all-to-all-v) of
        ``recv_rows[r]`` rows and the sent arrays' other dimensions. One NCCL group of a send
        and a receive a peer (empty ones left out, on both sides alike), on the backend stream:
        capturable in a graph."""
        if len(arrays) != self.world_size:
            raise ValueError(f"all_to_all needs one array per rank ({self.world_size}), "
                             f"got {len(arrays)}")
        if recv_rows is None:
            got = [self._out(a.shape, a.dtype) for a in arrays]
        else:
            rest, dtype = tuple(arrays[0].shape[1:]), arrays[0].dtype
            if any(tuple(a.shape[1:]) != rest or np.dtype(a.dtype) != np.dtype(dtype)
                   for a in arrays) or len(recv_rows) != self.world_size:
                raise ValueError("all_to_all with recv_rows: one row shape and dtype for every "
                                 f"array and one count a rank (got shapes "
                                 f"{[tuple(a.shape) for a in arrays]}, recv_rows {recv_rows})")
            got = [self._out((int(n), *rest), dtype) for n in recv_rows]
        self._b.group_start()
        for peer, (send, recv) in enumerate(zip(arrays, got)):
            if send.size:
                self._b.send(send.ptr, send.size, self._dtype(send), peer, self._handle,
                             self.backend.stream)
            if recv.size:
                self._b.recv(recv.ptr, recv.size, self._dtype(recv), peer, self._handle,
                             self.backend.stream)
        self._b.group_end()
        return got

    def all_to_all_rows(self, send_rows: list[int]) -> list[int]:
        """The rows each rank sends here (an all-to-all of int64 counts, then a host sync)."""
        counts = [self.backend.from_host(np.array([n], np.int64)) for n in send_rows]
        got = self.all_to_all(counts)
        return [int(self.backend.to_host(g)[0]) for g in got]

    def send(self, array: Any, dst: int) -> None:
        self._b.send(array.ptr, array.size, self._dtype(array), dst, self._handle,
                     self.backend.stream)

    def recv(self, array: Any, src: int) -> Any:
        self._b.recv(array.ptr, array.size, self._dtype(array), src, self._handle,
                     self.backend.stream)
        return array

    def barrier(self) -> None:
        flag = self.backend.zeros((1,), np.float32)
        self.all_reduce(flag)
        self.backend.synchronize()

    def abort(self) -> None:
        """End every collective in flight (a peer died); the communicator is unusable after."""
        comm, self._comm = self._comm, None
        if comm is not None:
            comm.abort()

    def close(self) -> None:
        p2p, self._p2p = getattr(self, "_p2p", None), None
        if p2p is not None:
            p2p.close()
        comm, self._comm = self._comm, None
        if comm is not None:
            try:
                comm.destroy()
            except Exception:  # noqa: BLE001 - a peer may be gone; destroying is best effort
                comm.abort()
