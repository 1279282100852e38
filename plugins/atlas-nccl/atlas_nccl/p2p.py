"""One-shot all-reduce of small tensors over peer-mapped memory (``kernels/p2p_allreduce.cu``).

Tensor-parallel decode all-reduces ``batch x hidden`` activations twice a layer: a few KB that
NCCL's protocols take ~6-7 us each to move even inside a CUDA graph (the issue's probe on two
H200s), so at TP=2 the 8B's 73 all-reduces cost ~0.5 ms of a ~3 ms step. Every rank here shares
one ``cuMemAlloc`` buffer with its peers through CUDA IPC, and one kernel copies, signals and sums
(see the kernel's comment for the protocols: "pull" reads the peers' copies after the handshake,
"push" writes this rank's part into every peer's buffer before it and then reads locally; both
give the same bits). Tensors past :data:`DEFAULT_MAX_BYTES`, other ops than sum, and ranks on
different hosts stay on NCCL.

Set up once per communicator, collectively: every rank publishes its IPC handle and host name
through the rendezvous store (an empty value when it cannot take part), opens its peers'
handles, and the ranks agree through one NCCL all-reduce, so either all ranks use this path or
none does: a split decision would deadlock the first call.

``ATLAS_P2P_ALLREDUCE=0`` turns it off; ``ATLAS_P2P_ALLREDUCE_MAX_KB`` sets the size limit;
``ATLAS_P2P_ALLREDUCE_MODE`` picks the protocol (``push``, the default, ``pull``, or ``ll``:
epoch-tagged lines and no flags for tensors up to :data:`LL_MAX_BYTES`, push above; not yet
measured), read once at set-up. It is off when ``NCCL_P2P_DISABLE`` is set (runs that stand in for separate nodes). All
three must be the same on every rank; the ranks check the mode when they agree to use the path.
"""

from __future__ import annotations

import ctypes
import logging
import os
import socket
from typing import Any

import numpy as np

log = logging.getLogger("atlas.nccl")

#: Largest tensor (bytes) reduced this way; larger ones go to NCCL, whose bandwidth-optimal
#: protocols win once moving the data costs more than synchronising.
DEFAULT_MAX_BYTES = 1 << 20
#: Must match P2P_MAX_RANKS, P2P_MAX_BLOCKS and P2P_HEADER in the kernel.
MAX_RANKS, MAX_BLOCKS, HEADER = 8, 64, 4096
#: Least seconds a kernel waits for a peer's flag before it traps.
TRAP_AFTER_S = 600.0
#: Threads per block of the kernel (its __launch_bounds__).
THREADS = 256
DTYPES = ("bfloat16", "float16", "float32")
#: The protocols, in the order the ranks compare them by; their kernels are ``<name>_<dtype>``.
MODES = {"pull": "p2p_allreduce", "push": "p2p_allreduce_push", "ll": "p2p_allreduce_ll"}
#: Largest tensor the ``ll`` protocol takes (its lines carry 8 bytes of data in 16); larger
#: ones take ``push`` in that mode.
LL_MAX_BYTES = 64 << 10
KEY = "nccl/p2p/{}"


def enabled() -> bool:
    """Whether the environment allows the peer-memory path."""
    if os.environ.get("ATLAS_P2P_ALLREDUCE", "1").strip().lower() in ("0", "false", "off", "no"):
        return False
    return os.environ.get("NCCL_P2P_DISABLE", "0").strip() in ("", "0")


def max_bytes() -> int:
    """The size limit (``ATLAS_P2P_ALLREDUCE_MAX_KB``, default 1024 KB)."""
    kb = os.environ.get("ATLAS_P2P_ALLREDUCE_MAX_KB")
    return DEFAULT_MAX_BYTES if not kb else max(16, int(kb) << 10)


def mode() -> str:
    """The protocol (``ATLAS_P2P_ALLREDUCE_MODE``: ``push``, the default: faster at every size
    measured on 2 x H200, ``pull``, or ``ll``)."""
    name = os.environ.get("ATLAS_P2P_ALLREDUCE_MODE", "").strip().lower() or "push"
    if name not in MODES:
        raise ValueError(f"ATLAS_P2P_ALLREDUCE_MODE={name!r}: use one of {', '.join(MODES)}")
    return name


def region_bytes(limit: int) -> int:
    """Bytes of one block's region from one rank: the most vectors :meth:`P2pAllReduce.all_reduce`
    gives a block for tensors up to ``limit`` bytes (a full block of threads below 64 blocks, a
    64th of the limit at 64), so a block's region sits at the same offset for every size."""
    return 16 * max(THREADS, -(-(limit // 16) // MAX_BLOCKS))


def ll_region_bytes() -> int:
    """Bytes of one block's ``ll`` lines from one rank: two 16-byte lines a vector, for the most
    vectors a block gets of a tensor up to :data:`LL_MAX_BYTES`."""
    return 2 * region_bytes(LL_MAX_BYTES)


def buffer_bytes(limit: int, world: int) -> int:
    """Bytes of a rank's shared buffer: the header, then two slots of ``world x MAX_BLOCKS``
    regions (push lands rank r's part in region r; pull uses region 0 of its own buffer), then
    the ``ll`` area: two slots of ``world x MAX_BLOCKS`` line regions."""
    return ll_base(limit, world) + 2 * world * MAX_BLOCKS * ll_region_bytes()


def ll_base(limit: int, world: int) -> int:
    """Byte offset of the ``ll`` area in a rank's buffer."""
    return HEADER + 2 * world * MAX_BLOCKS * region_bytes(limit)


def grid(nvec: int) -> int:
    """Blocks for ``nvec`` 16-byte vectors: one per full block of threads, at most MAX_BLOCKS."""
    return max(1, min(MAX_BLOCKS, -(-nvec // THREADS)))


def _handle_bytes(handle: Any) -> bytes:
    return ctypes.string_at(handle.getPtr(), 64)


def _handle_from(data: bytes) -> Any:
    from cuda.bindings import driver
    handle = driver.CUipcMemHandle()
    ctypes.memmove(handle.getPtr(), data, 64)
    return handle


class P2pAllReduce:
    """The peer-memory all-reduce of one rank (build with :meth:`create`).

    Args:
        comm: this rank's :class:`~atlas_nccl.comm.NcclComm` (rank, world size, backend).
        own: this rank's shared allocation; ``peers``: every rank's buffer address here.
        limit: the size limit in bytes; ``protocol``: a key of :data:`MODES`.

    ``mode`` may be changed between calls (tests and A/B scripts) if every rank changes it at
    the same call: both protocols share the buffer, its epochs and flags.
    """

    def __init__(self, comm: Any, own: Any, opened: list[int], peers: list[int],
                 limit: int, protocol: str) -> None:
        self.comm, self.own, self.opened, self.limit = comm, own, opened, limit
        self.mode, self.region = protocol, region_bytes(limit)
        backend = comm.backend
        self.peers = backend.from_host(np.array(peers + [0] * (MAX_RANKS - len(peers)),
                                                np.uint64))
        # A backstop only: the worker's step watchdog ends a rank whose peer died (and so the
        # spinning kernel with its context) after --distributed-timeout plus compile time.
        self.timeout_ns = np.uint64(int(max(comm.timeout, TRAP_AFTER_S) * 1e9))
        self.calls = 0

    @classmethod
    def create(cls, comm: Any, store: Any) -> P2pAllReduce | None:
        """Set up the path on every rank, or None on every rank (collective: all ranks call it)."""
        rank, world = comm.rank, comm.world_size
        if not enabled() or store is None or world < 2:
            return None  # the environment is the same on every rank, like NCCL's own settings
        own, limit, payload, protocol = None, max_bytes(), b"", mode()
        ok = world <= MAX_RANKS
        if ok:
            try:
                from cuda.bindings import driver

                from atlas_cuda.driver import DeviceAllocation, check
                own = DeviceAllocation(buffer_bytes(limit, world))
                check(driver.cuMemsetD8(own.ptr, 0, own.nbytes))
                handle = check(driver.cuIpcGetMemHandle(own.ptr))
                payload = socket.gethostname().encode() + b"\0" + _handle_bytes(handle)
            except Exception as exc:  # noqa: BLE001 - fall back to NCCL, agreed below
                log.info("peer-memory all-reduce unavailable on rank %d: %s", rank, exc)
                ok, own = False, None
        store.set(KEY.format(rank), payload)
        peers: list[int] = []
        opened: list[int] = []
        if ok:
            try:
                peers, opened = cls._open_peers(rank, world, store, payload, own.ptr)
            except Exception as exc:  # noqa: BLE001 - e.g. no P2P between these devices
                log.info("peer-memory all-reduce: rank %d cannot map its peers: %s", rank, exc)
                ok = False
        # min of (ok, mode, -mode): mixed modes would sum stale regions, so they fall back too
        m = list(MODES).index(protocol)
        agreed = comm.backend.from_host(np.array([1 if ok else 0, m, -m], np.int32))
        comm.nccl_all_reduce(agreed, "min")
        votes = comm.backend.to_host(agreed)
        if int(votes[1]) != -int(votes[2]):
            log.warning("rank %d: ranks set different ATLAS_P2P_ALLREDUCE_MODE; all-reduces go "
                        "through NCCL", rank)
        if not int(votes[0]) or int(votes[1]) != -int(votes[2]):
            cls._close(opened)
            log.info("rank %d: all-reduces go through NCCL only", rank)
            return None
        if rank == 0:
            log.info("all-reduces up to %d KB through peer memory (%d ranks, %s), larger "
                     "through NCCL", limit >> 10, world, protocol)
        return cls(comm, own, opened, peers, limit, protocol)

    @staticmethod
    def _open_peers(rank: int, world: int, store: Any, payload: bytes,
                    own_ptr: int) -> tuple[list[int], list[int]]:
        from cuda.bindings import driver

        from atlas_cuda.driver import check
        host = payload.split(b"\0", 1)[0]
        peers, opened = [0] * world, []
        try:
            for p in range(world):
                if p == rank:
                    peers[p] = own_ptr
                    continue
                theirs = store.get(KEY.format(p))
                if not theirs:
                    raise RuntimeError(f"rank {p} has no shared buffer")
                their_host, data = theirs.split(b"\0", 1)
                if their_host != host:
                    raise RuntimeError(f"rank {p} runs on {their_host.decode()}, not on "
                                       f"{host.decode()}")
                flags = driver.CUipcMem_flags.CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
                peers[p] = int(check(driver.cuIpcOpenMemHandle(_handle_from(data), flags)))
                opened.append(peers[p])
        except Exception:
            P2pAllReduce._close(opened)
            raise
        return peers, opened

    @staticmethod
    def _close(opened: list[int]) -> None:
        from cuda.bindings import driver
        for ptr in opened:
            try:
                driver.cuIpcCloseMemHandle(ptr)
            except Exception:  # noqa: BLE001 - shutting down
                pass

    def takes(self, array: Any, op: str) -> bool:
        """Whether this call runs here: decided by op, dtype and size only, so every rank
        decides alike."""
        return (op == "sum" and 0 < array.nbytes <= self.limit and array.nbytes % 16 == 0
                and np.dtype(array.dtype).name in DTYPES)

    def all_reduce(self, array: Any) -> Any:
        """Sum ``array`` over the ranks in place (check :meth:`takes` first)."""
        if array.ptr % 16:
            raise ValueError("p2p all-reduce needs 16-byte aligned tensors (workspace arrays "
                             "are); set ATLAS_P2P_ALLREDUCE=0 to use NCCL")
        ctx = self.comm.backend.ctx
        nvec, world = array.nbytes // 16, self.comm.world_size
        if self.mode == "ll" and array.nbytes <= LL_MAX_BYTES:
            kernel, area = MODES["ll"], (ll_base(self.limit, world), ll_region_bytes())
        else:
            kernel, area = MODES["push" if self.mode == "ll" else self.mode], (self.region,)
        ctx.launch(ctx.kernel("p2p_allreduce", array.dtype, kernel), grid(nvec), THREADS, array,
                   self.peers, np.int32(self.comm.rank), np.int32(world), np.int64(nvec),
                   *(np.int64(a) for a in area), self.timeout_ns, pdl=ctx.pdl)
        self.calls += 1
        return array

    def close(self) -> None:
        """Unmap the peers' buffers (this rank's own is freed with the object)."""
        opened, self.opened = self.opened, []
        self._close(opened)
