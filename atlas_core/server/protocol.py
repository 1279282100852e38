"""uvicorn's h11 protocol with a header deadline and a clear 431 for oversized headers.

Stock uvicorn waits forever for the headers of a request (a half-open or slow client holds its
connection as long as it likes) and answers any unparsable head, oversized ones included, with a
bare 400.
"""

from __future__ import annotations

import functools
from http import HTTPStatus

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from atlas_core.server.errors import APIError, error_bytes


#: Seconds an answered bad connection keeps reading (and dropping) what the client still sends:
#: closing a socket with unread data resets it, and the client may lose the answer.
LINGER_S = 1.0


class _Connection(h11.Connection):
    """Remembers the protocol error it raised, so the answer can use its status hint."""

    last_error: h11.RemoteProtocolError | None = None

    def next_event(self):
        try:
            return super().next_event()
        except h11.RemoteProtocolError as exc:
            self.last_error = exc
            raise


class GuardedH11Protocol(H11Protocol):
    """An h11 connection that must send each request head within ``header_timeout`` seconds
    and in at most ``max_header_bytes`` bytes.

    Build it with :func:`guarded_protocol`; uvicorn passes the rest.
    """

    def __init__(self, *args, header_timeout: float, max_header_bytes: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.conn = _Connection(h11.SERVER, max_header_bytes)
        self.header_timeout = header_timeout
        self.max_header_bytes = max_header_bytes
        self.header_timer = None
        self.answered = False

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._arm_header_timer()

    def connection_lost(self, exc) -> None:
        self._disarm_header_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.answered:
            return
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:
            self._disarm_header_timer()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm_header_timer()

    def _arm_header_timer(self) -> None:
        self._disarm_header_timer()
        self.header_timer = self.loop.call_later(self.header_timeout, self._header_timed_out)

    def _disarm_header_timer(self) -> None:
        if self.header_timer is not None:
            self.header_timer.cancel()
            self.header_timer = None

    def _header_timed_out(self) -> None:
        self.header_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        if self.conn.trailing_data[0] and self.conn.our_state is h11.IDLE:
            self._answer(APIError(408, f"the request headers did not arrive within "
                                  f"{self.header_timeout:g} s; send the whole request at once"))
        else:
            self.transport.close()

    def send_400_response(self, msg: str) -> None:
        error = self.conn.last_error
        if error is not None and error.error_status_hint == 431:
            self._answer(APIError(431, f"the request headers are larger than the server limit "
                                  f"of {self.max_header_bytes} bytes; send fewer or shorter "
                                  "headers", code="headers_too_large"))
        else:
            self._answer(APIError(400, "malformed HTTP request: the request line or a header "
                                  "could not be parsed"))

    def _answer(self, exc: APIError) -> None:
        body = error_bytes(exc, "")
        head = (f"HTTP/1.1 {exc.status} {HTTPStatus(exc.status).phrase}\r\n"
                "content-type: application/json\r\nconnection: close\r\n"
                f"content-length: {len(body)}\r\n\r\n").encode("latin-1")
        self.transport.write(head + body)
        self.answered = True
        self._disarm_header_timer()
        if self.transport.can_write_eof():
            self.transport.write_eof()
            self.loop.call_later(LINGER_S, self.transport.close)
        else:
            self.transport.close()


def guarded_protocol(header_timeout: float, max_header_bytes: int):
    """The protocol factory to give ``uvicorn.Config(http=...)``."""
    return functools.partial(GuardedH11Protocol, header_timeout=header_timeout,
                             max_header_bytes=max_header_bytes)
