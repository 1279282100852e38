"""The rendezvous: a small TCP key-value store, and the message channel it is built on.

Node 0 (or the launcher's rank 0) hosts a :class:`StoreServer` at ``MASTER_ADDR:MASTER_PORT``;
every rank connects a :class:`StoreClient` and meets the others through it: rank 0 of the comm
publishes the NCCL unique id (or the CPU comm's socket addresses) and the others wait for it,
the engine publishes where workers reach it. Values are any picklable object.
"""

from __future__ import annotations

import pickle
import socket
import struct
import threading
import time
from typing import Any

_HEADER = struct.Struct("!Q")


class PeerLostError(ConnectionError):
    """The process at the other end of a channel went away (or stopped answering in time)."""


class Channel:
    """Length-prefixed pickled messages over one connected socket.

    Args:
        sock: a connected stream socket (owned by the channel from now on).
        peer: how error messages name the other end.
    """

    def __init__(self, sock: socket.socket, peer: str = "peer") -> None:
        self.sock, self.peer = sock, peer
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            # a peer machine that vanishes without closing is noticed within ~1 minute
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            for name, value in (("TCP_KEEPIDLE", 30), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 3)):
                if hasattr(socket, name):
                    sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)
        self._send_lock = threading.Lock()

    @classmethod
    def connect(cls, host: str, port: int, timeout: float, peer: str = "peer") -> "Channel":
        """Connect to ``host:port``, retrying until ``timeout`` seconds have passed."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                sock = socket.create_connection((host, port), timeout=min(5.0, timeout))
                sock.settimeout(None)
                return cls(sock, peer)
            except OSError as exc:
                if time.monotonic() >= deadline:
                    raise PeerLostError(f"cannot reach {peer} at {host}:{port} within "
                                        f"{timeout:.0f} s: {exc}") from None
                time.sleep(0.05)

    def send(self, obj: Any) -> None:
        """Send one message."""
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        try:
            with self._send_lock:
                self.sock.sendall(_HEADER.pack(len(data)) + data)
        except OSError as exc:
            raise PeerLostError(f"{self.peer} is gone ({exc})") from None

    def recv(self, timeout: float | None = None) -> Any:
        """The next message; :class:`PeerLostError` on EOF, error or ``timeout`` seconds."""
        self.sock.settimeout(timeout)
        try:
            size = _HEADER.unpack(self._read(_HEADER.size))[0]
            return pickle.loads(self._read(size))
        except socket.timeout:
            raise PeerLostError(f"{self.peer} sent nothing for {timeout:.0f} s") from None
        except OSError as exc:
            raise PeerLostError(f"{self.peer} is gone ({exc})") from None
        finally:
            try:
                self.sock.settimeout(None)
            except OSError:
                pass

    def _read(self, n: int) -> bytes:
        buf = bytearray(n)
        view, got = memoryview(buf), 0
        while got < n:
            k = self.sock.recv_into(view[got:])
            if k == 0:
                raise PeerLostError(f"{self.peer} closed the connection")
            got += k
        return bytes(buf)

    def fileno(self) -> int:
        return self.sock.fileno()

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class StoreServer:
    """The store itself: a dict served on a listening socket by one thread per client.

    Args:
        host, port: where to listen (port 0: any free port; see :attr:`port`).
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._data: dict[str, Any] = {}
        self._cond = threading.Condition()
        self._listener = socket.create_server((host, port), reuse_port=False)
        self.host, self.port = host, self._listener.getsockname()[1]
        self._closed = False
        threading.Thread(target=self._accept, name="atlas-store", daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                sock, addr = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(Channel(sock, f"store client {addr}"),),
                             daemon=True).start()

    def _serve(self, chan: Channel) -> None:
        try:
            while True:
                op, key, value = chan.recv()
                if op == "set":
                    with self._cond:
                        self._data[key] = value
                        self._cond.notify_all()
                    chan.send(True)
                elif op == "get":
                    deadline = time.monotonic() + value
                    with self._cond:
                        while key not in self._data and time.monotonic() < deadline:
                            self._cond.wait(min(1.0, max(0.0, deadline - time.monotonic())))
                        found = key in self._data
                        chan.send((found, self._data.get(key)))
        except (PeerLostError, EOFError, ValueError):
            chan.close()

    def put(self, key: str, value: Any) -> None:
        """Set ``key`` from the process hosting the store."""
        with self._cond:
            self._data[key] = value
            self._cond.notify_all()

    def peek(self, key: str) -> Any:
        """The value of ``key`` now (None when unset), from the hosting process."""
        with self._cond:
            return self._data.get(key)

    def close(self) -> None:
        self._closed = True
        try:
            self._listener.close()
        except OSError:
            pass


class StoreClient:
    """One connection to the store.

    Args:
        host, port: the store's address (``MASTER_ADDR`` / ``MASTER_PORT``).
        timeout: seconds to wait for the store to come up, and for a key in :meth:`get`.
    """

    def __init__(self, host: str, port: int, timeout: float) -> None:
        self.timeout = timeout
        self._chan = Channel.connect(host, port, timeout, peer=f"the rendezvous store {host}:{port}")
        self._lock = threading.Lock()

    def set(self, key: str, value: Any) -> None:
        """Publish ``value`` under ``key`` (overwrites)."""
        with self._lock:
            self._chan.send(("set", key, value))
            self._chan.recv(self.timeout)

    def get(self, key: str, timeout: float | None = None) -> Any:
        """The value of ``key``, waiting for it to be set.

        Raises:
            TimeoutError: nobody set ``key`` within the timeout.
        """
        wait = self.timeout if timeout is None else timeout
        with self._lock:
            self._chan.send(("get", key, wait))
            found, value = self._chan.recv(wait + 30.0)
        if not found:
            raise TimeoutError(f"no rank published {key!r} within {wait:.0f} s: a peer did not "
                               "start or cannot reach the rendezvous (check --master-addr / "
                               "MASTER_ADDR and that every rank was started)")
        return value

    def close(self) -> None:
        self._chan.close()
