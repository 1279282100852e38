"""docs/env_vars.md lists exactly the ``ATLAS_CUDA_*`` variables the cuda backend reads, one line
each: every kernel policy field's variable and the profiling build's, none that was removed."""

from __future__ import annotations

import re
from pathlib import Path

from atlas_cuda.policy import KNOBS

ROOT = Path(__file__).resolve().parents[3]


def _documented() -> list[str]:
    doc = (ROOT / "docs/env_vars.md").read_text()
    return re.findall(r"^\| `(ATLAS_CUDA_[A-Z0-9_]+)` \|", doc, re.M)


def test_every_cuda_env_var_is_documented():
    src = "".join(p.read_text() for p in (ROOT / "plugins/atlas-cuda/atlas_cuda").glob("*.py"))
    names = set(re.findall(r"ATLAS_CUDA_[A-Z0-9_]+", src))
    missing = sorted(names - set(_documented()))
    assert names and not missing, f"document these in docs/env_vars.md: {missing}"


def test_documented_cuda_vars_are_read_and_listed_once():
    documented = _documented()
    read = {k.env for k in KNOBS} | {"ATLAS_CUDA_NVRTC_DEFINES"}
    assert len(documented) == len(set(documented)), "one line per variable in docs/env_vars.md"
    stale = sorted(set(documented) - read)
    assert not stale, f"docs/env_vars.md lists variables nothing reads: {stale}"
