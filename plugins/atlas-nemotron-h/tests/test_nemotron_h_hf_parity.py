"""Logit parity with HF transformers on a tiny float32 Nemotron-H checkpoint saved by HF
(numpy backend): prefill, decode, 32 greedy tokens; and bf16 logits as close as HF's own.

The reference is HF run in float64 on the same float32 weights. Tolerance: max |atlas - hf| <=
2e-5 * max(1, max |hf|) over every compared logit. Prompts cross the SSD chunk size (16 in the
tiny config) and the KV block size (16 in ForwardRunner).
"""

from __future__ import annotations

import numpy as np
import pytest
from nemotron_checkpoints import prompt

from atlas_core.api import load_model
from atlas_core.testing.checkpoints import hf_float64_model, hf_logits
from atlas_core.testing.forward import ForwardRunner, assert_logits_close, greedy_logits

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.reference
RTOL = 2e-5
DECODE_STEPS = 3
GREEDY_TOKENS = 32
ARCH = "NemotronHForCausalLM"


@pytest.fixture(scope="module")
def hf(checkpoint):
    return hf_float64_model(ARCH, checkpoint)


def test_prefill_and_decode_match_hf(checkpoint, backend, registry, hf):
    model = load_model(checkpoint, backend, registry=registry)
    batch = [prompt(1, 37), prompt(2, 5), prompt(3, 16), prompt(4, 1)]
    runner = ForwardRunner(model, backend, max_seqs=len(batch))
    sequences, ours = greedy_logits(runner, batch, DECODE_STEPS)
    for seq, logits in zip(sequences, ours):
        assert_logits_close(logits, hf_logits(hf, seq)[:len(seq)], RTOL)


def test_32_greedy_tokens_match_hf(checkpoint, backend, registry, hf):
    # HF greedy is argmax of HF's forward at every step, so ours equals it exactly when HF's
    # argmax after each prefix of prompt + our tokens is our next token: one HF pass checks
    # all 32. (generate() of transformers 5.24 with its torch fallback kernels returns
    # first-step logits 0.66 away from its own forward on the same prompt: not the reference.)
    model = load_model(checkpoint, backend, registry=registry)
    ids = prompt(5, 21)
    ours = ForwardRunner(model, backend, max_seqs=1).greedy([ids], GREEDY_TOKENS)[0]
    logits = hf_logits(hf, ids + ours)
    assert np.argmax(logits[len(ids) - 1:-1], axis=-1).tolist() == ours


def test_bf16_logits_as_close_to_float64_as_hf_bf16(registry, backend, tmp_path_factory):
    # bf16 rounding of every op differs between implementations, so the bar is HF's own: Atlas
    # bf16 may be at most 1.5x as far from the float64 logits as HF bf16 is (plus 0.02).
    from nemotron_checkpoints import save_hf_checkpoint

    path = save_hf_checkpoint(tmp_path_factory.mktemp("bf16") / "m", dtype="bfloat16",
                              registry=registry, seed=1)
    hf16 = transformers.NemotronHForCausalLM.from_pretrained(
        path, dtype=torch.bfloat16, experts_implementation="eager").eval()
    ids = prompt(6, 30)
    with torch.no_grad():
        ref = hf16.to(torch.float64)(torch.tensor([ids])).logits[0].numpy()
        hf16 = hf16.to(torch.bfloat16)
        theirs = hf16(torch.tensor([ids])).logits[0].float().numpy()
    model = load_model(path, backend, registry=registry)
    ours = ForwardRunner(model, backend, max_seqs=1).step([ids], all_logits=True)[0]
    hf_err, our_err = np.abs(theirs - ref).max(), np.abs(ours - ref).max()
    assert our_err <= 1.5 * hf_err + 0.02, (our_err, hf_err)


#: Nemotron-3 Super's latent MoE, one expert group, Nano-v2-like Mamba heads (not a power of
#: two, one group) and the older hybrid_override_pattern.
VARIANT = dict(moe_latent_size=48, n_group=1, topk_group=1, routed_scaling_factor=1.0,
               mamba_num_heads=6, mamba_head_dim=12, n_groups=1, ssm_state_size=24,
               chunk_size=8, conv_kernel=3, layers_block_type=None,
               hybrid_override_pattern="MEM*-E")


def test_latent_moe_and_odd_mamba_sizes_match_hf(registry, backend, tmp_path_factory):
    from nemotron_checkpoints import save_hf_checkpoint

    path = save_hf_checkpoint(tmp_path_factory.mktemp("variant") / "m", registry=registry,
                              seed=2, **VARIANT)
    model = load_model(path, backend, registry=registry)
    hf64 = hf_float64_model(ARCH, path)
    batch = [prompt(7, 19), prompt(8, 4)]
    sequences, ours = greedy_logits(ForwardRunner(model, backend, max_seqs=2), batch, 1)
    for seq, logits in zip(sequences, ours):    # the prompt, then one greedy token
        assert_logits_close(logits, hf_logits(hf64, seq), RTOL)
