"""``atlas bench`` on a vision-language shape reports the image encode time and the TTFT of an
image + 100-token prompt (tiny-qwen3-vl on the numpy backend; needs atlas-qwen3vl)."""

import re

import pytest

from atlas_core.bench.shapes import SHAPES
from atlas_core.bench.vision import PROMPT_TEXT_TOKENS, image_prompt_len
from atlas_core.cli import main

pytest.importorskip("atlas_qwen3vl")
pytest.importorskip("PIL")


def test_image_prompt_len():
    assert image_prompt_len(SHAPES["tiny"], 1024) == 0
    vl = SHAPES["qwen3-vl-30b-a3b"]
    assert image_prompt_len(vl, 1024) == 32 * 32 + PROMPT_TEXT_TOKENS + 2
    assert image_prompt_len(vl, 64) == 8 * 8 + PROMPT_TEXT_TOKENS + 2


def test_bench_reports_vision_timings(capsys):
    assert main(["bench", "--model", "tiny-qwen3-vl", "--backend", "numpy", "--context", "16",
                 "--decode-tokens", "4", "--image-size", "256"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"vision: 256x256 image = 64 tokens; preprocess [\d.]+ ms, encode [\d.]+ ms, "
                     r"TTFT \(image \+ 100 tokens\) [\d.]+ ms", out), out
