"""Tiny Qwen3 / Qwen3-MoE checkpoints on the cuda backend against HF transformers (torch CPU).

Tolerances as in atlas-qwen3's numpy parity tests: float32 max |diff| < 2e-3 (GPU float32 sums
in another order), bfloat16 dense max |diff| < 0.15, bfloat16 MoE mean |diff| < 0.03.
"""

import numpy as np
import pytest

from cuda_probe import HAS_GPU

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from atlas_core.api import load_model  # noqa: E402
from atlas_core.api import Registry, make_plugin_manager  # noqa: E402
from atlas_core.testing.checkpoints import write_tiny_checkpoint  # noqa: E402
from atlas_core.testing.forward import ForwardRunner  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.reference,
              pytest.mark.skipif(not HAS_GPU, reason="no CUDA device")]
ARCHS = ["Qwen3ForCausalLM", "Qwen3MoeForCausalLM"]


@pytest.fixture(scope="module")
def registry():
    return Registry(make_plugin_manager(allow=["qwen3", "cuda"]))


def _pair(tmp_path_factory, registry, cuda_backend, arch, dtype):
    path = write_tiny_checkpoint(arch, tmp_path_factory.mktemp(arch), dtype=dtype,
                                 registry=registry)
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).eval()
    return load_model(path, cuda_backend, registry=registry), hf


def _hf_logits(hf, ids):
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0].float().numpy()


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_logits_match_hf(tmp_path_factory, registry, cuda_backend, arch, dtype):
    model, hf = _pair(tmp_path_factory, registry, cuda_backend, arch, dtype)
    runner = ForwardRunner(model, model.backend, max_seq_len=64)
    for n in (1, 17, 40):
        ids = np.random.default_rng(n).integers(0, 377, n).tolist()
        got = runner.step([ids], all_logits=True)[0]
        runner.reset()
        diff = np.abs(got - _hf_logits(hf, ids))
        if dtype == "float32":
            assert diff.max() < 2e-3
        elif arch.startswith("Qwen3Moe"):
            assert diff.mean() < 0.03
        else:
            assert diff.max() < 0.15


@pytest.mark.parametrize("arch", ARCHS)
def test_logits_match_hf_with_layer_scope(tmp_path_factory, registry, cuda_backend, monkeypatch,
                                          arch):
    """Every step reusing each layer's workspace (the LayerScope long prefills take)."""
    import atlas_cuda.backend
    monkeypatch.setattr(atlas_cuda.backend, "LAYER_SCOPE_BYTES", 0)
    model, hf = _pair(tmp_path_factory, registry, cuda_backend, arch, "float32")
    runner = ForwardRunner(model, model.backend, max_seq_len=64)
    ids = np.random.default_rng(3).integers(0, 377, 40).tolist()
    got = runner.step([ids], all_logits=True)[0]
    assert np.abs(got - _hf_logits(hf, ids)).max() < 2e-3


@pytest.mark.parametrize("scoped", [False, True])
def test_greedy_matches_hf_generate(tmp_path_factory, registry, cuda_backend, monkeypatch,
                                    scoped):
    if scoped:  # prefill and every decode step (graphs included) through the LayerScope
        import atlas_cuda.backend
        monkeypatch.setattr(atlas_cuda.backend, "LAYER_SCOPE_BYTES", 0)
    model, hf = _pair(tmp_path_factory, registry, cuda_backend, "Qwen3ForCausalLM", "float32")
    prompt = np.random.default_rng(7).integers(0, 377, 14).tolist()
    got = ForwardRunner(model, model.backend, max_seq_len=64).greedy([prompt], num_tokens=24)[0]
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False,
                          eos_token_id=None, pad_token_id=0)
    assert got == out[0, len(prompt):].tolist()
