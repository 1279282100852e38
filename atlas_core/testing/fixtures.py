"""Where the real tokenizer / chat-template fixtures live (test data, not shipped)."""

from __future__ import annotations

from pathlib import Path

from atlas_core import env

_REPO = Path(__file__).resolve().parents[2]


def real_models_dir() -> Path:
    """The ``real-models`` fixture folder.

    Looked up in order: ``$ATLAS_FIXTURES_DIR``, ``shared/fixtures/real-models`` inside the
    checkout, then ``../shared/fixtures/real-models`` beside it (the team layout). Raises
    ``FileNotFoundError`` saying where it looked when none exists.
    """
    candidates = [Path(p) for p in [env.fixtures_dir()] if p]
    candidates += [_REPO / "shared" / "fixtures" / "real-models",
                   _REPO.parent / "shared" / "fixtures" / "real-models"]
    for path in candidates:
        if path.is_dir():
            return path
    raise FileNotFoundError("real-model fixtures not found; looked in "
                            + ", ".join(map(str, candidates))
                            + " (set ATLAS_FIXTURES_DIR to the real-models folder)")
