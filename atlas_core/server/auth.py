"""API-key authentication (``Authorization: Bearer <key>`` or ``x-api-key: <key>``)."""

from __future__ import annotations

import hmac
from pathlib import Path

from atlas_core.server.errors import APIError, send_error

OPEN_PATHS = ("/health", "/health/live", "/metrics")


def read_tokens_file(path: str | Path) -> list[str]:
    """API keys from a file: one per line; blank lines and ``#`` comments are skipped.

    Raises:
        ValueError: the file cannot be read or holds no key.
    """
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise ValueError(f"cannot read --auth-tokens-file {path}: {exc.strerror}") from None
    tokens = [ln.strip() for ln in lines if ln.strip() and not ln.strip().startswith("#")]
    if not tokens:
        raise ValueError(f"--auth-tokens-file {path} holds no token (one per line)")
    return tokens


def presented_key(headers: dict[bytes, bytes]) -> str | None:
    auth = headers.get(b"authorization", b"").decode("latin-1").strip()
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip()
    key = headers.get(b"x-api-key")
    return key.decode("latin-1").strip() if key else None


def auth_middleware(keys: list[str]):
    """ASGI middleware factory rejecting requests without a valid key (401, API's error shape).

    ``/health``, ``/health/live``, ``/metrics`` and CORS preflights stay open.
    """
    encoded = [k.encode() for k in keys]

    def is_valid(key: str | None) -> bool:
        if key is None:
            return False
        candidate = key.encode()
        return any(hmac.compare_digest(candidate, k) for k in encoded)

    def wrap(app):
        async def checked(scope, receive, send):
            if (scope["type"] != "http" or scope["path"] in OPEN_PATHS
                    or scope["method"] == "OPTIONS"):
                await app(scope, receive, send)
                return
            key = presented_key(dict(scope["headers"]))
            if is_valid(key):
                await app(scope, receive, send)
                return
            why = "missing API key" if key is None else "invalid API key"
            err = APIError(401, f"{why}: send `Authorization: Bearer <key>` or `x-api-key: <key>` "
                           "with a key given to the server by --api-key or --auth-tokens-file",
                           code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
            await send_error(send, err, scope["path"])
        return checked
    return wrap
