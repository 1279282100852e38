"""``batch_invariant`` (``atlas serve / bench --batch-invariant``): the flags reach EngineArgs,
the engine asks the backend for the mode before the weights load, a backend without one refuses,
and what the mode cannot cover (tensor parallelism, speculative decoding) is refused up front.
The cuda side is in plugins/atlas-cuda/tests/test_batch_invariant_{host,cuda}.py."""

from __future__ import annotations

import argparse
import logging
from types import SimpleNamespace

import pytest

from atlas_core.engine import EngineArgs, LLMEngine, SamplingParams
from atlas_core.interfaces.gpu_backend import GpuBackend
from atlas_core.plugins import Registry
from atlas_core.testing.checkpoints import write_tiny_checkpoint
from atlas_core.testing.fake_model import run_to_completion

pytestmark = pytest.mark.timeout(120)


def test_default_is_off():
    assert EngineArgs().batch_invariant is False


def test_serve_flag_reaches_engine_args():
    from atlas_core.cli.serve import add_parser, engine_args
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    assert engine_args(parser.parse_args(["serve", "m"])).batch_invariant is False
    assert engine_args(parser.parse_args(["serve", "m", "--batch-invariant"])).batch_invariant


def test_bench_flag_parses():
    from atlas_core.cli.bench import add_parser
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    assert parser.parse_args(["bench"]).batch_invariant is False
    assert parser.parse_args(["bench", "--batch-invariant", "--batch", "1,32"]).batch_invariant


def test_tensor_parallelism_is_refused():
    with pytest.raises(ValueError, match="batch_invariant needs one GPU"):
        EngineArgs(batch_invariant=True, tensor_parallel_size=2)


def test_speculative_decoding_is_refused():
    with pytest.raises(ValueError, match="batch_invariant does not cover speculative"):
        EngineArgs(batch_invariant=True,
                   speculative_config={"method": "ngram", "num_speculative_tokens": 2})


def test_a_backend_without_the_mode_refuses():
    fake = SimpleNamespace(name="fancy")
    with pytest.raises(NotImplementedError, match="the fancy backend has no batch-invariant"):
        GpuBackend.set_batch_invariant(fake, True)
    GpuBackend.set_batch_invariant(fake, False)  # off is always fine


class _Recording:
    """Wraps a backend; records set_batch_invariant calls relative to bind_model."""

    def __init__(self, inner):
        self.__dict__["inner"], self.__dict__["calls"] = inner, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def set_batch_invariant(self, on):
        self.calls.append(("batch_invariant", on))
        self.inner.set_batch_invariant(on)

    def bind_model(self, model, quant=None):
        self.calls.append(("bind_model", model))
        self.inner.bind_model(model, quant)


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory):
    registry = Registry()
    if "Qwen3ForCausalLM" not in registry.names("weight_loaders"):
        pytest.skip("Qwen3ForCausalLM is not registered (install atlas-qwen3)")
    return write_tiny_checkpoint("Qwen3ForCausalLM", tmp_path_factory.mktemp("q3"),
                                 dtype="bfloat16", registry=registry)


def test_engine_sets_the_mode_before_loading(qwen3_dir, caplog):
    from atlas_core.engine.loading import create_backend, load_engine_parts
    backend = _Recording(create_backend("numpy")[0])
    args = EngineArgs(model=str(qwen3_dir), backend="numpy", num_kv_blocks=64, block_size=8,
                      batch_invariant=True)
    parts = load_engine_parts(args, backend=backend)
    assert backend.calls[0] == ("batch_invariant", True)
    assert ("bind_model", "qwen3") in backend.calls[1:]
    with caplog.at_level(logging.INFO, logger="atlas_core.engine.llm_engine"):
        engine = LLMEngine(parts.model, parts.backend, args, tokenizer=parts.tokenizer)
    assert "batch-invariant mode on (numpy backend)" in caplog.text
    engine.add_request("a", [1, 2, 3, 4, 5], SamplingParams(temperature=0, max_tokens=4,
                                                            ignore_eos=True))
    assert len(run_to_completion(engine)["a"].outputs[0].token_ids) == 4


def test_bench_runs_in_the_mode(tmp_path, monkeypatch, caplog):
    """The hook the cost is measured with (``atlas bench --batch-invariant``): here on numpy,
    a named shape with random weights (the path qwen3-8b takes on a GPU)."""
    from atlas_core.cli import main
    monkeypatch.setenv("ATLAS_CACHE_DIR", str(tmp_path))
    with caplog.at_level(logging.INFO, logger="atlas_core.engine.llm_engine"):
        assert main(["bench", "--model", "tiny", "--backend", "numpy", "--prompt-len", "32",
                     "--decode-tokens", "4", "--batch", "1,2", "--copy-mb", "1",
                     "--batch-invariant"]) == 0
    assert "batch-invariant mode on (numpy backend)" in caplog.text
