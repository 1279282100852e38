"""Quantized checkpoints of every family that can run them: the model kept quantized gives the
logits (to float32 summation order) and greedy tokens of the float model of its dequantized
weights (numpy), each
family in an FP8 and an NVFP4 scheme. A family whose plugin is not installed is skipped."""

import numpy as np
import pytest

from atlas_core.model import load_model
from atlas_core.ops.quant import QuantizedWeight
from atlas_core.plugins import Registry
from atlas_core.testing.forward import ForwardRunner
from atlas_core.testing.quant_checkpoints import write_quantized_checkpoint

PROMPT = [5, 9, 200, 31, 7, 64]
FAMILIES = ["NemotronHForCausalLM", "DeepseekV3ForCausalLM", "Mistral4ForCausalLM",
            "Qwen3NextForCausalLM", "Gemma4ForCausalLM", "MiniMaxM2ForCausalLM"]

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def registry():
    return Registry()


def _run(model, greedy=0):
    runner = ForwardRunner(model, model.backend, max_seq_len=32)
    if greedy:
        return runner.greedy([PROMPT], num_tokens=greedy)
    return runner.step([PROMPT], all_logits=True)[0]


@pytest.mark.parametrize("scheme", ["fp8_block", "nvfp4_modelopt"])
@pytest.mark.parametrize("arch", FAMILIES)
def test_each_family_runs_kept_quantized(tmp_path, registry, arch, scheme):
    if arch not in registry.names("weight_loaders"):
        pytest.skip(f"no plugin registers {arch}")
    q = write_quantized_checkpoint(arch, tmp_path / "q", scheme, reference=tmp_path / "ref",
                                   registry=registry)
    model = load_model(q, "numpy", registry=registry, dtype="float32")
    kept = [n for n, module, local, _ in model.named_specs()
            if isinstance(module.params[local], QuantizedWeight)]
    assert kept, f"{arch} kept nothing quantized"
    reference = load_model(tmp_path / "ref", "numpy", registry=registry, dtype="float32")
    # float32 sums in another order at most: Nemotron-H runs a quantized shared expert beside
    # the routed ones instead of inside their op (1.8e-7 apart at fp8_block)
    np.testing.assert_allclose(_run(model), _run(reference), rtol=0, atol=1e-5)
    assert _run(model, greedy=4) == _run(reference, greedy=4)


def test_nvfp4_qwen35_with_an_unlisted_bf16_mtp_head(tmp_path, registry):
    """As Qwen3.5 NVFP4 checkpoints ship it: the MTP head's tensors are plain (no scales) and
    no exclusion list names them; they load plain, and MTP speculation gives the tokens of the
    float model of the dequantized weights and of plain decoding."""
    from atlas_core.engine import EngineArgs, LLMEngine, SamplingParams
    from atlas_core.testing.fake_model import run_to_completion
    from atlas_core.testing.mtp_heads import add_mtp_head
    arch = "Qwen3_5MoeForCausalLM"
    if arch not in registry.names("weight_loaders"):
        pytest.skip("atlas-qwen35 is not installed")
    q = write_quantized_checkpoint(arch, tmp_path / "q", "nvfp4_modelopt",
                                   reference=tmp_path / "ref", registry=registry)
    loader = registry.create("weight_loaders", arch, registry=registry)
    for path in (q, tmp_path / "ref"):
        add_mtp_head(path, arch, loader, seed=4)

    def tokens(path, spec):
        engine = LLMEngine.from_args(EngineArgs(
            model=str(path), backend="numpy", num_kv_blocks=64, max_num_seqs=4, block_size=8,
            speculative_config=spec, dtype="float32"))
        for i, p in enumerate([PROMPT * 3, [3, 4, 5]]):
            engine.add_request(f"r{i}", p, SamplingParams(temperature=0, max_tokens=12,
                                                           ignore_eos=True))
        out = {k: v.outputs[0].token_ids for k, v in run_to_completion(engine).items()}
        return out, engine

    mtp = {"method": "mtp", "num_speculative_tokens": 2}
    got, engine = tokens(q, mtp)
    assert engine.stats().speculative.num_draft_tokens > 0
    assert not any(n.startswith("mtp") for n, module, local, _ in engine.model.named_specs()
                   if isinstance(module.params[local], QuantizedWeight))
    assert got == tokens(tmp_path / "ref", mtp)[0] == tokens(q, None)[0]
