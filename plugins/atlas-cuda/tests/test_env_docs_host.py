"""Every ``ATLAS_CUDA_*`` variable the cuda backend reads is documented in docs/env_vars.md."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_every_cuda_env_var_is_documented():
    src = "".join(p.read_text() for p in (ROOT / "plugins/atlas-cuda/atlas_cuda").glob("*.py"))
    names = set(re.findall(r"ATLAS_CUDA_[A-Z0-9_]+", src))
    doc = (ROOT / "docs/env_vars.md").read_text()
    missing = sorted(n for n in names if f"`{n}`" not in doc)
    assert names and not missing, f"document these in docs/env_vars.md: {missing}"
