"""Running an app under uvicorn: on a socket bound up front, in this thread or a background one."""

from __future__ import annotations

import socket
import threading
import time

import uvicorn

from atlas_core.server.config import ServerConfig
from atlas_core.server.protocol import guarded_protocol


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (port 0 picks a free one).

    Raises:
        OSError: the address is in use or cannot be bound.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def make_server(app, sock: socket.socket, *, log_level: str = "warning") -> uvicorn.Server:
    """A uvicorn server for ``app`` that will listen on ``sock``.

    An Atlas app's :class:`~atlas_core.server.config.ServerConfig` sets the header deadline and
    size limit of its connections (see :mod:`atlas_core.server.protocol`).
    """
    host, port = sock.getsockname()[:2]
    state = getattr(getattr(app, "state", None), "atlas", None)
    settings = state.config if state is not None else ServerConfig(served_model_names=["-"])
    http = guarded_protocol(settings.header_timeout, settings.max_header_bytes)
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False,
                            timeout_graceful_shutdown=5, lifespan="on", http=http)
    return _Server(config)


class _Server(uvicorn.Server):
    """Ends open generations before uvicorn's graceful wait, so Ctrl-C stops at once and
    streaming clients get a proper end (``abort`` / an error event) instead of a cut."""

    async def shutdown(self, sockets=None) -> None:
        state = getattr(getattr(self.config.app, "state", None), "atlas", None)
        if state is not None:
            state.stop_streams()
            cancel_encodes = getattr(state.tokenizer, "cancel_encodes", None)
            if cancel_encodes is not None:
                cancel_encodes()
        await super().shutdown(sockets=sockets)

    async def on_tick(self, counter: int) -> bool:
        state = getattr(getattr(self.config.app, "state", None), "atlas", None)
        if state is not None and state.should_exit():
            return True
        return await super().on_tick(counter)


class ServerThread:
    """Serve ``app`` on ``host`` (a free port) from a daemon thread; a context manager.

    Example:
        with ServerThread(app) as server:
            httpx.get(f"{server.url}/health")
    """

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, start_timeout: float = 30.0):
        self.sock = bind_socket(host, port)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://{host}:{self.port}"
        self.server = make_server(app, self.sock)
        self.start_timeout = start_timeout
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       daemon=True, name="atlas-server")

    def __enter__(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + self.start_timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the test server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()
