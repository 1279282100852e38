"""MTP draft rounds replayed from graphs (issue #27, ``draft_graphs``) on a tiny Qwen3.5 with a
random MTP head: on the frozen-graph backend (replays the op calls recorded at capture, as a
CUDA graph does, and raises on an array freed after capture) and on the mock backend (replays
by running the captured code again), every step's drafts and every final token equal those of
the eager draft path, over batches that cross buckets as sequences finish and join; and a
round whose captured metadata is dropped after capture is caught at replay."""

from __future__ import annotations

import gc

import pytest

from atlas_core.api import EngineArgs, LLMEngine, Registry, SamplingParams
from atlas_core.backends.mock_backend import MockGpuBackend
from atlas_core.engine.spec.draft_graphs import DraftGraphs
from atlas_core.testing.checkpoints import write_tiny_checkpoint
from atlas_core.testing.frozen_graphs import FrozenGraphBackend, GraphReadsFreedArray
from atlas_core.testing.mtp_heads import add_mtp_head
from atlas_core.testing.mtp_script import MTP_SPEC, run_requests

pytestmark = pytest.mark.timeout(300)

ARCH = "Qwen3_5ForCausalLM"
#: (arrival step, prompt length, max_tokens): batches grow past 2 and 4 sequences, then shrink
#: and refill as sequences finish and later ones join.
REQUESTS = [(0, 7, 9), (0, 12, 5), (1, 3, 14), (2, 17, 7), (2, 5, 11), (6, 9, 8), (9, 4, 6)]


@pytest.fixture(scope="module")
def mtp_path(tmp_path_factory):
    registry = Registry()
    if ARCH not in registry.names("weight_loaders"):
        pytest.skip("atlas-qwen35 is not installed: pip install --no-deps -e plugins/atlas-qwen35")
    path = write_tiny_checkpoint(ARCH, tmp_path_factory.mktemp("draftgraphs") / ARCH,
                                 registry=registry)
    add_mtp_head(path, ARCH, registry.get("weight_loaders", ARCH)())
    return path


def make_engine(path, backend, draft_graphs: bool):
    args = EngineArgs(model=str(path), num_kv_blocks=96, max_num_seqs=4, block_size=8,
                      async_scheduling=False,
                      speculative_config={**MTP_SPEC, "draft_graphs": draft_graphs})
    return LLMEngine.from_args(args, backend=backend)


@pytest.mark.parametrize("backend", [FrozenGraphBackend, MockGpuBackend])
def test_draft_graphs_give_the_eager_drafts(mtp_path, backend):
    eager = make_engine(mtp_path, backend(), draft_graphs=False)
    want_log, want = run_requests(eager, REQUESTS, seed=3)
    engine = make_engine(mtp_path, backend(), draft_graphs=True)
    log, got = run_requests(engine, REQUESTS, seed=3)
    assert got == want and len(got) == len(REQUESTS)
    assert log == want_log
    graphs = engine.speculator.proposer.graphs
    assert eager.speculator.proposer.graphs is None
    assert graphs is not None and graphs.num_replays > 0
    assert {1, 2, 4} <= set(graphs.graphs), sorted(graphs.graphs)
    assert engine.stats().speculative.num_draft_tokens > 0
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_plain_decode_steps_replay_the_first_round(mtp_path):
    """A step of plain decode rows (no drafts verified: the gate off) drafts from graphs
    alone: its rounds are all one position per sequence."""
    engine = make_engine(mtp_path, FrozenGraphBackend(), draft_graphs=True)
    proposer = engine.speculator.proposer
    for i, n in enumerate((5, 9)):
        engine.add_request(f"p{i}", list(range(3, 3 + n)),
                           SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    engine.step()  # prefill: the head's first round is eager (several positions a sequence)
    seqs = [s for s in engine.scheduler.running]
    assert len(seqs) == 2
    before = proposer.graphs.num_replays
    layout = [(seq, len(seq) - 2, 1) for seq in seqs]  # as if each had just decoded one token
    proposer.observe(layout)
    assert proposer.graphs.num_replays - before == MTP_SPEC["num_speculative_tokens"]
    assert all(len(proposer.drafts[s.seq_id][1]) == MTP_SPEC["num_speculative_tokens"]
               for s in seqs)


def test_a_freed_capture_array_is_caught(mtp_path, monkeypatch):
    """The bug of session 16, on draft graphs: an index array only the captured metadata
    references, the metadata dropped after capture. A CUDA graph would read reused memory;
    the frozen-graph backend raises at the first replay."""
    build = DraftGraphs._metadata

    def private_positions(self, views, bucket):
        meta = build(self, views, bucket)
        meta.positions = self.backend.from_host(self.host["positions"][:bucket].copy())
        return meta

    def drops_meta(self, bucket):
        graph, holder = capture(self, bucket)
        del holder["meta"]
        return graph, holder

    capture = DraftGraphs._capture
    monkeypatch.setattr(DraftGraphs, "_metadata", private_positions)
    monkeypatch.setattr(DraftGraphs, "_capture", drops_meta)
    engine = make_engine(mtp_path, FrozenGraphBackend(), draft_graphs=True)
    proposer = engine.speculator.proposer
    graphs, proposer.graphs = proposer.graphs, None  # the prefill step drafts eagerly
    engine.add_request("r", list(range(3, 12)),
                       SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
    engine.step()
    proposer.graphs = graphs
    (seq,) = engine.scheduler.running
    gc.collect()
    with pytest.raises(GraphReadsFreedArray, match="released after capture"):
        proposer.observe([(seq, len(seq) - 2, 1)])  # captures bucket 1, then replays it


def test_no_graphs_without_backend_support(mtp_path):
    """On a backend without graphs the flag changes nothing: every round stays eager."""
    args = EngineArgs(model=str(mtp_path), backend="numpy", num_kv_blocks=64, max_num_seqs=4,
                      block_size=8, speculative_config={**MTP_SPEC, "draft_graphs": True})
    assert LLMEngine.from_args(args).speculator.proposer.graphs is None
