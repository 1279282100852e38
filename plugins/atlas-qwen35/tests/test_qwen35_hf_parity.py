"""Logit parity with HF transformers on tiny float32 hybrid checkpoints (numpy backend).

The reference is HF run in float64 on the same float32 weights: HF's own float32 run differs
from it by up to ~3e-5 relative (the chunked delta rule's triangular solve is sensitive), Atlas
by less. Tolerance: max |atlas - hf| <= 2e-5 * max(1, max |hf|) over every compared logit (the
tied-embedding Qwen3.5 model has logits up to ~60).
"""

from __future__ import annotations

import pytest
from qwen35_cases import ARCHS, prompts

from atlas_core.api import load_model
from atlas_core.testing.checkpoints import hf_float64_model as hf_model
from atlas_core.testing.checkpoints import hf_logits
from atlas_core.testing.forward import ForwardRunner, assert_logits_close, greedy_logits

pytest.importorskip("torch")
pytest.importorskip("transformers")

pytestmark = pytest.mark.reference
RTOL = 2e-5
DECODE_STEPS = 3


@pytest.mark.parametrize("arch", ARCHS)
def test_prefill_and_decode_match_hf(arch, checkpoints, backend, registry):
    model = load_model(checkpoints[arch], backend, registry=registry)
    hf = hf_model(arch, checkpoints[arch])
    batch = prompts()
    runner = ForwardRunner(model, backend, max_seqs=len(batch))
    sequences, ours = greedy_logits(runner, batch, DECODE_STEPS)
    # One HF pass over prompt + generated tokens gives the prefill rows and every decode step's.
    for seq, logits in zip(sequences, ours):
        assert_logits_close(logits, hf_logits(hf, seq)[:len(seq)], RTOL)


@pytest.mark.parametrize("arch", ["Qwen3_5ForConditionalGeneration",
                                  "Qwen3_5MoeForConditionalGeneration"])
def test_vl_wrapper_text_path_matches_hf(arch, registry, backend, tmp_path):
    from atlas_core.testing.checkpoints import write_tiny_checkpoint

    path = write_tiny_checkpoint(arch, tmp_path / "m", registry=registry)
    model = load_model(path, backend, registry=registry)
    hf = hf_model(arch, path)
    prompt = prompts()[0]
    ours = ForwardRunner(model, backend, max_seqs=1).step([prompt], all_logits=True)[0]
    assert_logits_close(ours, hf_logits(hf, prompt), RTOL)
