"""docs/plugins/tutorial.md shows code CI runs: every sample is copied from a file in the repo."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
TUTORIAL = ROOT / "docs" / "plugins" / "tutorial.md"
#: Where samples may come from: the example plugin and the in-tree plugins.
SOURCES = [ROOT / "examples" / "atlas-toy", ROOT / "plugins"]
CHECKED = ("python", "toml", "cuda")


def _samples() -> list[tuple[str, str]]:
    blocks = re.findall(r"^```(\w+)\n(.*?)^```$", TUTORIAL.read_text(), re.S | re.M)
    return [(lang, body) for lang, body in blocks if lang in CHECKED]


def _files() -> list[str]:
    suffixes = {".py", ".toml", ".cu"}
    return [p.read_text() for root in SOURCES for p in root.rglob("*")
            if p.suffix in suffixes and p.is_file() and ".egg-info" not in str(p)]


def test_the_tutorial_has_samples_of_every_step():
    langs = [lang for lang, _ in _samples()]
    assert langs.count("python") >= 8 and "toml" in langs and "cuda" in langs


@pytest.mark.parametrize("sample", [body for _, body in _samples()],
                         ids=lambda body: body.strip().splitlines()[0][:40])
def test_every_sample_is_copied_from_a_file(sample):
    assert any(sample in text for text in _files()), (
        "docs/plugins/tutorial.md shows code that no file of examples/atlas-toy or plugins/ "
        f"contains; copy it again from the file:\n{sample}")
