"""Turn a model name or path into a local directory: local dir, HF cache, then download."""

from __future__ import annotations

import os
import re
from pathlib import Path

#: Files fetched when a model is downloaded (no .bin / .pt / .gguf weights).
ALLOW_PATTERNS = ["*.json", "*.safetensors", "*.jinja", "tokenizer.model", "*.tiktoken",
                  "*.txt", "tokenizer*"]

_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")


class ModelNotFoundError(FileNotFoundError):
    """The model is neither a local directory, nor in a Hugging Face cache, nor downloadable."""


def hf_cache_dirs(cache_dir: str | os.PathLike | None = None) -> list[Path]:
    """Hugging Face hub cache directories to search, most specific first.

    ``cache_dir`` alone when given; else ``$HF_HUB_CACHE``, ``$HF_HOME/hub`` and
    ``~/.cache/huggingface/hub``.
    """
    if cache_dir is not None:
        return [Path(cache_dir).expanduser()]
    dirs = []
    if os.environ.get("HF_HUB_CACHE"):
        dirs.append(Path(os.environ["HF_HUB_CACHE"]).expanduser())
    if os.environ.get("HF_HOME"):
        dirs.append(Path(os.environ["HF_HOME"]).expanduser() / "hub")
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    dirs.append(Path(xdg).expanduser() / "huggingface" / "hub")
    return list(dict.fromkeys(dirs))


def find_in_cache(repo_id: str, cache: Path, revision: str | None = None) -> Path | None:
    """The snapshot directory of ``repo_id`` at ``revision`` in one hub cache, if complete.

    Layout: ``models--{org}--{name}/refs/{revision}`` holds a commit hash naming
    ``snapshots/{hash}/``. A commit hash may also be given directly as ``revision``.
    """
    repo_dir = cache / ("models--" + repo_id.replace("/", "--"))
    ref = repo_dir / "refs" / (revision or "main")
    commit = None
    if ref.is_file():
        commit = ref.read_text().strip()
    elif revision and _COMMIT.match(revision):
        commit = revision
    elif revision is None and (repo_dir / "snapshots").is_dir():
        snapshots = [p for p in (repo_dir / "snapshots").iterdir() if p.is_dir()]
        commit = snapshots[0].name if len(snapshots) == 1 else None
    if commit is None:
        return None
    snapshot = repo_dir / "snapshots" / commit
    return snapshot if (snapshot / "config.json").is_file() else None


def resolve_model(name_or_path: str | os.PathLike, cache_dir: str | os.PathLike | None = None,
                  revision: str | None = None) -> Path:
    """Local directory holding the model's files.

    Looks, in order, at: an existing local directory; the Hugging Face hub caches
    (:func:`hf_cache_dirs`); a download with ``huggingface_hub.snapshot_download`` (config,
    safetensors, tokenizer and chat-template files only) unless ``HF_HUB_OFFLINE`` is set.

    Raises:
        ModelNotFoundError: with every place looked and how to fix it.
    """
    raw = str(name_or_path)
    path = Path(raw).expanduser()
    if path.is_dir():
        return path
    looked = [f"local path {path} (no such directory)"]
    if path.suffix == ".gguf":
        raise ModelNotFoundError(f"model {raw!r} is a GGUF file (llama.cpp's format), which Atlas "
                                 "does not load; pass the model's Hugging Face repo id or a "
                                 "directory with config.json and *.safetensors")
    if path.exists() or raw.startswith(("/", ".", "~")) or not _REPO_ID.match(raw):
        raise ModelNotFoundError(f"model {raw!r}: {path} is not a model directory; pass a "
                                 "directory with config.json and *.safetensors, or a Hugging Face "
                                 "repo id like Qwen/Qwen3-0.6B")
    for cache in hf_cache_dirs(cache_dir):
        found = find_in_cache(raw, cache, revision)
        if found is not None:
            return found
        looked.append(f"Hugging Face cache {cache}")
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        looked.append("download skipped (HF_HUB_OFFLINE is set)")
    else:
        try:
            return _download(raw, cache_dir, revision)
        except Exception as exc:  # noqa: BLE001 - any hub/network failure becomes one message
            looked.append(f"download from the Hugging Face Hub failed ({type(exc).__name__}: "
                          f"{str(exc).splitlines()[0] if str(exc) else ''})")
    raise ModelNotFoundError(
        f"model {raw!r}{'@' + revision if revision else ''} not found; looked at: "
        + "; ".join(looked)
        + ". Fix: pass a local directory, set HF_HOME (or HF_HUB_CACHE) to the cache holding it, "
          "pass --cache-dir, or allow network access to huggingface.co (check the repo id and "
          "HF_TOKEN for gated models)")


def _download(repo_id: str, cache_dir: str | os.PathLike | None, revision: str | None) -> Path:
    from huggingface_hub import snapshot_download

    local = snapshot_download(repo_id, revision=revision, allow_patterns=ALLOW_PATTERNS,
                              cache_dir=str(cache_dir) if cache_dir is not None else None)
    return Path(local)
