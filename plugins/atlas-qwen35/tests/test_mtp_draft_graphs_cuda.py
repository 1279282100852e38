"""MTP draft rounds replayed from CUDA graphs (issue #27, ``draft_graphs``) on the cuda backend:
a tiny bf16 Qwen3.5 with a random MTP head, batches crossing the 1 / 2 / 4 buckets as
sequences finish and join.

Every round that fits a graph runs twice on the same inputs: eagerly (the proposer's own path),
then from the graph; the head's output rows and drafts are compared. In batch-invariant mode
(one code path per op whatever the row count) both must be equal, and so must the whole run's
drafts and tokens against a run with ``draft_graphs`` off; in the default mode the padded
bucket may round differently, so rows are held to bf16 noise and draft flips are printed
(``-s``).

    python -m pytest -q -s plugins/atlas-qwen35/tests/test_mtp_draft_graphs_cuda.py -p no:cacheprovider
"""

from __future__ import annotations


import numpy as np
import pytest
from atlas_core.testing.mtp_heads import add_mtp_head
from atlas_core.testing.mtp_script import MTP_SPEC, run_requests
from qwen35_cuda_probe import HAS_GPU

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HAS_GPU, reason="no CUDA device"),
              pytest.mark.timeout(900)]

ARCH = "Qwen3_5ForCausalLM"
REQUESTS = [(0, 13, 12), (0, 30, 6), (1, 5, 18), (2, 47, 9), (2, 9, 14), (7, 21, 10),
            (11, 4, 8)]
#: Relative L2 error allowed per head-output row between graph and eager in the default mode.
NOISE = 2e-2


@pytest.fixture(scope="module")
def mtp_path(registry, tmp_path_factory):
    from atlas_core.testing.checkpoints import write_tiny_checkpoint
    root = tmp_path_factory.mktemp("draft_graphs_cuda")
    path = write_tiny_checkpoint(ARCH, root / ARCH, dtype="bfloat16", registry=registry)
    add_mtp_head(path, ARCH, registry.get("weight_loaders", ARCH)())
    return path


def _engine(be, path, invariant, draft_graphs):
    from atlas_core.api import EngineArgs, LLMEngine
    be.set_batch_invariant(invariant)
    return LLMEngine.from_args(EngineArgs(
        model=str(path), backend="cuda", max_num_seqs=4, block_size=16, num_kv_blocks=256,
        enable_prefix_caching=False, async_scheduling=False, gpu_memory_utilization=0.5,
        speculative_config={**MTP_SPEC, "draft_graphs": draft_graphs}), backend=be)


def _run(engine, dual_stats=None):
    """Step through REQUESTS; (drafts after every step by request, final tokens). With
    ``dual_stats``, every graph round is also run eagerly first and compared."""
    proposer, be = engine.speculator.proposer, engine.backend
    graphs = proposer.graphs
    if dual_stats is not None:
        replay = graphs.step

        def dual(runs, ids, hidden, rows):
            proposer.graphs = None
            out_e, tok_e = proposer._round(runs, ids, hidden, rows)
            proposer.graphs = graphs
            out_g, tok_g = replay(runs, ids, hidden, rows)
            n = len(runs)
            e = be.to_host(out_e).astype(np.float32)
            g = be.to_host(out_g)[:n].astype(np.float32)
            err = float(np.max(np.linalg.norm(e - g, axis=-1)
                               / np.maximum(np.linalg.norm(e, axis=-1), 1e-6)))
            dual_stats["rounds"] += 1
            dual_stats["max err"] = max(dual_stats["max err"], err)
            dual_stats["flips"] += int(np.sum(np.asarray(tok_e) != np.asarray(tok_g)))
            return out_g, tok_g

        graphs.step = dual
    return run_requests(engine, REQUESTS, seed=9)


@pytest.mark.parametrize("invariant", [True, False])
def test_draft_graphs_on_cuda(be, mtp_path, invariant):
    want_log, want = _run(_engine(be, mtp_path, invariant, draft_graphs=False))
    stats = {"rounds": 0, "max err": 0.0, "flips": 0}
    engine = _engine(be, mtp_path, invariant, draft_graphs=True)
    log, got = _run(engine, stats)
    graphs = engine.speculator.proposer.graphs
    same = sum(a == b for a, b in zip(log, want_log))
    print(f"\ninvariant={invariant}: {stats}, buckets {sorted(graphs.graphs)}, steps with "
          f"identical drafts {same}/{len(want_log)}, tokens equal {got == want}")
    assert graphs.num_replays > 0 and {1, 2, 4} <= set(graphs.graphs)
    assert len(got) == len(REQUESTS)
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    if invariant:
        assert stats["max err"] == 0.0 and stats["flips"] == 0
        assert log == want_log and got == want
    else:
        assert stats["max err"] < NOISE, stats
