"""The ``cpu`` CommBackend: collectives between processes over TCP sockets, on NumPy arrays.

It runs the multi-process paths of tensor and expert parallelism on the numpy backend (CI, a
laptop): every rank connects to every other (a full mesh, fine for the 2-8 ranks of one
model), each peer connection has a sender thread so sends never block a receive. Reductions
add the ranks' contributions in rank order in float32, so every rank gets the same bits.
"""

from __future__ import annotations

import queue
import socket
import threading
from typing import Any

import numpy as np

from atlas_core.interfaces import CommBackend
from atlas_core.parallel.store import Channel, PeerLostError, StoreClient

_REDUCE = {"sum": np.sum, "max": np.max, "min": np.min}


class CommTimeoutError(RuntimeError):
    """A peer did not take part in a collective in time (it died or hangs)."""


class _Peer:
    def __init__(self, chan: Channel) -> None:
        self.chan = chan
        self.outbox: queue.Queue = queue.Queue()
        self.error: Exception | None = None
        self.sender = threading.Thread(target=self._send_loop, daemon=True)
        self.sender.start()

    def close(self, timeout: float) -> None:
        """Send what is queued (a peer may still be waiting for this rank's last
        contribution), then close the connection."""
        self.outbox.put(None)
        self.sender.join(timeout)
        self.chan.close()

    def _send_loop(self) -> None:
        while True:
            item = self.outbox.get()
            if item is None:
                return
            try:
                self.chan.send(item)
            except PeerLostError as exc:
                self.error = exc
                return


class CpuComm(CommBackend):
    """A rank of a world of processes joined by sockets (arrays are host NumPy arrays).

    Args:
        rank, world_size: this rank and the number of ranks.
        store: the :class:`~atlas_core.parallel.store.StoreClient` the ranks meet through
            (each publishes its listening address there).
        timeout: seconds to wait for a peer in any collective before
            :class:`CommTimeoutError`.
        host: address this rank listens on and advertises (default: loopback).
        prefix: store key prefix (two communicators in one store need different ones).
        **options: other factory options are ignored.
    """

    def __init__(self, rank: int = 0, world_size: int = 1, *, store: StoreClient | None = None,
                 timeout: float = 300.0, host: str = "127.0.0.1", prefix: str = "cpu_comm",
                 **options: Any) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside 0..{world_size - 1}")
        if world_size > 1 and store is None:
            raise ValueError("the cpu comm backend needs a rendezvous store for more than one "
                             "rank (atlas_core.parallel.store.StoreClient)")
        self.rank, self.world_size, self.timeout = rank, world_size, timeout
        self._peers: dict[int, _Peer] = {}
        if world_size > 1:
            self._connect(store, host, prefix)

    def _connect(self, store: StoreClient, host: str, prefix: str) -> None:
        listener = socket.create_server((host, 0))
        store.set(f"{prefix}/addr/{self.rank}", (host, listener.getsockname()[1]))
        for peer in range(self.rank):
            addr = store.get(f"{prefix}/addr/{peer}", self.timeout)
            chan = Channel.connect(*addr, self.timeout, peer=f"rank {peer}")
            chan.send(self.rank)
            self._peers[peer] = _Peer(chan)
        listener.settimeout(self.timeout)
        try:
            for _ in range(self.rank + 1, self.world_size):
                sock, _addr = listener.accept()
                chan = Channel(sock)
                peer = chan.recv(self.timeout)
                chan.peer = f"rank {peer}"
                self._peers[peer] = _Peer(chan)
        except socket.timeout:
            raise CommTimeoutError(f"rank {self.rank}: not every higher rank connected within "
                                   f"{self.timeout:.0f} s") from None
        finally:
            listener.close()

    def _exchange(self, outgoing: dict[int, Any]) -> dict[int, Any]:
        # copies: the sender threads pickle later, after the caller may have overwritten them
        for peer, item in outgoing.items():
            self._peers[peer].outbox.put(np.array(item))
        got = {}
        for peer in outgoing:
            try:
                got[peer] = self._peers[peer].chan.recv(self.timeout)
            except PeerLostError as exc:
                raise CommTimeoutError(f"rank {self.rank}: {exc}") from None
        return got

    def _gather_all(self, array: np.ndarray) -> list[np.ndarray]:
        others = self._exchange({p: array for p in self._peers})
        return [array if r == self.rank else others[r] for r in range(self.world_size)]

    def all_reduce(self, array: Any, op: str = "sum") -> Any:
        """Reduce into ``array`` in place (and return it)."""
        if op not in _REDUCE:
            raise ValueError(f"unsupported all_reduce op {op!r}; use one of {', '.join(_REDUCE)}")
        if self.world_size == 1:
            return array
        parts = self._gather_all(array)
        total = parts[0].astype(np.float32)
        for part in parts[1:]:
            total = _REDUCE[op](np.stack([total, part.astype(np.float32)]), axis=0)
        array[...] = total.astype(array.dtype)
        return array

    def all_gather(self, array: Any, axis: int = 0) -> Any:
        if self.world_size == 1:
            return array
        return np.concatenate(self._gather_all(array), axis=axis)

    def reduce_scatter(self, array: Any, op: str = "sum") -> Any:
        """Reduce ``array`` ``[world_size * n, ...]`` and return this rank's ``n`` rows."""
        if array.shape[0] % self.world_size:
            raise ValueError(f"reduce_scatter needs a first axis divisible by {self.world_size}, "
                             f"got {array.shape}")
        n = array.shape[0] // self.world_size
        total = self.all_reduce(np.array(array), op)
        return total[self.rank * n:(self.rank + 1) * n]

    def all_to_all(self, arrays: list[Any], recv_rows: list[int] | None = None) -> list[Any]:
        """Any shapes go through (pickled arrays); ``recv_rows`` is checked against them."""
        if len(arrays) != self.world_size:
            raise ValueError(f"all_to_all needs one array per rank ({self.world_size}), "
                             f"got {len(arrays)}")
        got = self._exchange({p: arrays[p] for p in self._peers})
        out = [arrays[r] if r == self.rank else got[r] for r in range(self.world_size)]
        if recv_rows is not None and [len(a) for a in out] != [int(n) for n in recv_rows]:
            raise ValueError(f"rank {self.rank}: all_to_all recv_rows {list(recv_rows)}, but the "
                             f"ranks sent {[len(a) for a in out]} rows")
        return out

    def all_to_all_rows(self, send_rows: list[int]) -> list[int]:
        got = self._exchange({p: np.array([send_rows[p]], np.int64) for p in self._peers})
        return [int(send_rows[r]) if r == self.rank else int(got[r][0])
                for r in range(self.world_size)]

    def send(self, array: Any, dst: int) -> None:
        self._peers[dst].outbox.put(np.array(array))

    def recv(self, array: Any, src: int) -> Any:
        try:
            array[...] = self._peers[src].chan.recv(self.timeout)
        except PeerLostError as exc:
            raise CommTimeoutError(f"rank {self.rank}: {exc}") from None
        return array

    def barrier(self) -> None:
        self.all_reduce(np.zeros(1, np.float32))

    def close(self) -> None:
        for peer in self._peers.values():
            peer.close(self.timeout)
        self._peers.clear()
