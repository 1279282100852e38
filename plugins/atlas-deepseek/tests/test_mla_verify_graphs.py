"""MLA models under speculative verify steps replayed from graphs (issue #27): a verify step is
not a decode step, so captured it must not take MLA's expanded path, whose gathered-context
size comes from the host ``seq_lens`` and would stay frozen at the capture step's (all
padding) in the graph. On :class:`~atlas_core.testing.frozen_graphs.FrozenGraphBackend`
(replays the recorded op calls as CUDA does), n-gram verify graphs give plain decoding's
greedy tokens."""

from __future__ import annotations

import numpy as np
import pytest

from atlas_core.api import EngineArgs, LLMEngine, Registry, SamplingParams
from atlas_core.testing.checkpoints import write_tiny_checkpoint
from atlas_core.testing.fake_model import run_to_completion
from atlas_core.testing.frozen_graphs import FrozenGraphBackend
from atlas_core.testing.spec_drafts import ScriptedProposer

pytestmark = pytest.mark.timeout(300)

ARCH = "DeepseekV3ForCausalLM"
SPEC = {"method": "ngram", "num_speculative_tokens": 2, "draft_token_cost": 0.0,
        "disable_by_batch_size": 4, "verify_graphs": True}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    registry = Registry()
    if ARCH not in registry.names("weight_loaders"):
        pytest.skip(f"{ARCH}'s plugin is not installed")
    return write_tiny_checkpoint(ARCH, tmp_path_factory.mktemp("mla_vg"), registry=registry)


def _run(engine, prompts, want=None):
    if want is not None:  # drafts from the plain run's own output, some wrong
        engine.speculator.proposer = ScriptedProposer(want, engine.model.vocab_size, 0.35, seed=3)
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", p, params)
    return {rid: list(o.outputs[0].token_ids) for rid, o in run_to_completion(engine).items()}


def test_mla_verify_graphs_give_plain_tokens(model_dir):
    rng = np.random.default_rng(11)
    prompts = [rng.integers(0, 300, 6 + 9 * i).tolist() for i in range(3)]
    common = dict(model=str(model_dir), num_kv_blocks=64, max_num_seqs=4, block_size=8,
                  async_scheduling=False)
    want = _run(LLMEngine.from_args(EngineArgs(backend="numpy", **common)), prompts)
    engine = LLMEngine.from_args(EngineArgs(speculative_config=SPEC, **common),
                                 backend=FrozenGraphBackend())
    got = _run(engine, prompts, want)
    assert engine.runner.num_verify_replays > 0
    assert got == want
