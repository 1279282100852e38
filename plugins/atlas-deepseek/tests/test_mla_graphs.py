"""GPU discipline of the MLA models on the mock backend: decode steps replay one captured graph
(absorbed MLA ops inside it) without allocating and with one host sync, prefill runs the
expanded ops eagerly, and graph decode equals eager numpy decode token for token."""

from __future__ import annotations

import pytest

from atlas_core.api import Registry, SamplingParams
from atlas_core.testing.checkpoints import write_tiny_checkpoint
from atlas_core.testing.fake_model import assert_graph_decode_steps, make_engine

ARCHS = ("DeepseekV3ForCausalLM", "Mistral4ForCausalLM")


@pytest.fixture(scope="module", params=ARCHS)
def model_dir(request, tmp_path_factory):
    registry = Registry()
    if request.param not in registry.names("weight_loaders"):
        pytest.skip(f"{request.param}'s plugin is not installed")
    return write_tiny_checkpoint(request.param, tmp_path_factory.mktemp("mla"), registry=registry)


def add(engine, n):
    for i in range(n):
        engine.add_request(f"r{i}", [5 + i, 17, 33 + i, 40, 41, 42, 43, 44, 45, 46][: 4 + 3 * i],
                           SamplingParams(max_tokens=6, ignore_eos=True, temperature=0))


def test_decode_replays_graphs_without_allocating(model_dir):
    engine = make_engine(model_dir, "mock", async_scheduling=False)
    backend = engine.backend
    add(engine, 3)
    with backend.record() as rec:
        engine.step()
    assert {"mla_gather_latent", "mla_expanded_attention"} <= set(rec.names("launch"))
    first = assert_graph_decode_steps(engine, steps=4, num_seqs=3)[0]
    assert {"mla_latent_cache", "mla_rope_query", "mla_absorb_query", "mla_absorbed_attention",
            "mla_absorb_output", "moe_route_grouped"} <= set(first.names("capture_node"))


def test_graph_decode_equals_eager_numpy(model_dir):
    tokens = []
    for backend in ("mock", "numpy"):
        engine = make_engine(model_dir, backend)
        add(engine, 3)
        done = {}
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    done[out.request_id] = out.outputs[0].token_ids
        tokens.append(done)
    assert tokens[0] == tokens[1]
