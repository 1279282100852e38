"""Every ``ATLAS_*`` environment variable is read here (and listed in docs/env_vars.md)."""

from __future__ import annotations

import os
from pathlib import Path


def plugin_allow_list() -> list[str] | None:
    """``ATLAS_PLUGINS``: comma-separated entry-point names to load; unset loads all."""
    raw = os.environ.get("ATLAS_PLUGINS")
    if raw is None or not raw.strip():
        return None
    return [p.strip() for p in raw.split(",") if p.strip()]


def cache_dir() -> Path:
    """``ATLAS_CACHE_DIR``: where Atlas keeps compiled kernels and other caches."""
    raw = os.environ.get("ATLAS_CACHE_DIR")
    if raw:
        return Path(raw).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "atlas"


def default_backend() -> str | None:
    """``ATLAS_BACKEND``: backend used when ``--backend`` is not given (default: best available)."""
    return os.environ.get("ATLAS_BACKEND") or None


def log_level() -> str:
    """``ATLAS_LOG_LEVEL``: logging level name (default ``INFO``)."""
    return os.environ.get("ATLAS_LOG_LEVEL", "INFO").upper()


def fixtures_dir() -> str | None:
    """``ATLAS_FIXTURES_DIR``: the real-model test fixtures folder (tests only)."""
    return os.environ.get("ATLAS_FIXTURES_DIR") or None


def host() -> str | None:
    """``ATLAS_HOST``: address ``atlas serve`` listens on when ``--host`` is not given."""
    return os.environ.get("ATLAS_HOST", "").strip() or None


def port() -> int | None:
    """``ATLAS_PORT``: port ``atlas serve`` listens on when ``--port`` is not given.

    Raises:
        ValueError: the variable is set but is not a port number.
    """
    raw = os.environ.get("ATLAS_PORT", "").strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) > 65535:
        raise ValueError(f"ATLAS_PORT={raw!r} is not a port number; set it to 1-65535 (e.g. "
                         "8888) or unset it")
    return int(raw)


def api_keys() -> list[str]:
    """``ATLAS_API_KEY``: the key ``atlas serve`` requires when no ``--api-key`` is given."""
    raw = os.environ.get("ATLAS_API_KEY", "").strip()
    return [raw] if raw else []


def parallel_profile() -> bool:
    """``ATLAS_PARALLEL_PROFILE``: ``1`` makes the engine and every worker of a ``-tp`` run log,
    at shutdown, where their host time went (handling each message kind, waiting for messages,
    waiting for the device): tells a host-bound step from a device-bound one."""
    return os.environ.get("ATLAS_PARALLEL_PROFILE", "").strip().lower() in ("1", "true", "on",
                                                                               "yes")
