"""Request guards that run before any route: local-server safety, content type, body timeout.

Without API keys a local server is reachable by every web page in the user's browser, so it
refuses what a browser sends on a page's behalf unless the user allowed it: a ``Host`` it does
not answer to (DNS rebinding) or an ``Origin`` other than its own or an allowed one
(cross-site requests). With API keys a page cannot present a key, so these two checks are off.
"""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

from atlas_core.server.config import LOCAL_HOSTS, ServerConfig
from atlas_core.server.errors import APIError, send_error

BODY_METHODS = {"POST", "PUT", "PATCH"}
WILDCARD_BINDS = {"0.0.0.0", "::", ""}


def host_name(value: str) -> str:
    """The host of a ``Host`` header or an address, lower-cased, without port or brackets."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1:value.find("]")] if "]" in value else value[1:]
    if value.count(":") == 1:
        return value.split(":", 1)[0]
    return value


def default_allowed_hosts(bind_host: str, extra: list[str]) -> list[str]:
    """The ``Host`` names a server bound to ``bind_host`` answers to without API keys.

    The local names and the bind address, plus ``extra``. A server bound to every interface
    (``0.0.0.0``) is reached under names it cannot know, so it answers to any unless ``extra``
    names them.
    """
    if bind_host in WILDCARD_BINDS and not extra:
        return ["*"]
    names = [*LOCAL_HOSTS, *extra]
    if bind_host not in WILDCARD_BINDS:
        names.append(host_name(bind_host))
    return list(dict.fromkeys(names))


def is_json_type(content_type: str) -> bool:
    """Whether a ``Content-Type`` names JSON (``application/json`` or ``*/*+json``)."""
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or media.endswith("+json")


def site_problem(headers: dict[bytes, bytes], hosts: set[str] | None,
                 origins: set[str] | None) -> APIError | None:
    """The 403 for a request a browser page may have sent without the user's consent."""
    host = headers.get(b"host", b"").decode("latin-1")
    if hosts is not None and host and host_name(host) not in hosts:
        return APIError(403, f"this server does not answer to Host `{host}` (it answers to "
                        f"{', '.join(sorted(hosts))}); restart it with --allowed-host "
                        f"{host_name(host)} to serve under that name, or set --api-key",
                        code="host_not_allowed")
    origin = headers.get(b"origin")
    if origin is None or origins is None:
        return None
    origin_text = origin.decode("latin-1").strip()
    parts = urlsplit(origin_text)
    if origin_text in origins or (host and parts.netloc.lower() == host.lower()):
        return None
    return APIError(403, f"cross-site request from Origin `{origin_text}` refused: a web page may "
                    "not drive this server; restart it with --allowed-origin "
                    f"{origin_text} to allow that page, or set --api-key",
                    code="origin_not_allowed")


def content_problem(method: str, headers: dict[bytes, bytes]) -> APIError | None:
    """The 415 for a body that says it is not JSON (form posts, ``text/plain``)."""
    content_type = headers.get(b"content-type")
    if method not in BODY_METHODS or content_type is None:
        return None
    text = content_type.decode("latin-1")
    if is_json_type(text):
        return None
    return APIError(415, f"Content-Type `{text}` is not supported: send the body as JSON with "
                    "`Content-Type: application/json`", code="unsupported_media_type")


def header_problem(scope, max_bytes: int) -> APIError | None:
    """The 431 for a request head over ``max_bytes`` that arrived in one piece (the protocol
    catches heads still arriving, see :mod:`atlas_core.server.protocol`)."""
    size = len(scope.get("raw_path") or b"") + len(scope.get("query_string") or b"")
    size += sum(len(name) + len(value) + 4 for name, value in scope["headers"])
    if size <= max_bytes:
        return None
    return APIError(431, f"the request headers ({size} bytes) are larger than the server limit "
                    f"of {max_bytes} bytes; send fewer or shorter headers",
                    code="headers_too_large")


def receive_within(receive, timeout: float):
    """``receive`` that raises a 408 when the request body is not in after ``timeout`` s."""
    loop = asyncio.get_running_loop()
    deadline: list[float] = []
    body_done = [False]

    async def timed_receive():
        if body_done[0]:
            return await receive()
        if not deadline:
            deadline.append(loop.time() + timeout)
        try:
            message = await asyncio.wait_for(receive(), max(deadline[0] - loop.time(), 0.0))
        except TimeoutError:
            raise APIError(408, f"the request body did not arrive within {timeout:g} s; send "
                           "it at once (server body timeout)",
                           headers={"Connection": "close"}) from None
        if message["type"] != "http.request" or not message.get("more_body", False):
            body_done[0] = True
        return message
    return timed_receive


def guard_middleware(config: ServerConfig):
    """ASGI middleware factory applying the guards of this module for ``config``."""
    check_site = not config.api_keys
    hosts = None if "*" in config.allowed_hosts else {host_name(h) for h in config.allowed_hosts}
    origins = None if "*" in config.allowed_origins else set(config.allowed_origins)

    def wrap(app):
        async def guarded(scope, receive, send):
            if scope["type"] != "http":
                await app(scope, receive, send)
                return
            headers = dict(scope["headers"])
            problem = (header_problem(scope, config.max_header_bytes)
                       or (check_site and site_problem(headers, hosts, origins))
                       or content_problem(scope["method"], headers))
            if problem:
                await send_error(send, problem, scope["path"])
                return
            await app(scope, receive_within(receive, config.body_timeout), send)
        return guarded
    return wrap
