"""Speculative decoding split over two worker processes (numpy backend, ``cpu`` comm): on tiny
Qwen3.5 checkpoints with a random MTP head (hybrid Gated DeltaNet + gated attention; dense,
and MoE under expert parallelism), greedy tokens with MTP (K=2) and n-gram (K=3) drafts are
those of the same split engine without speculation and of one process with it; the acceptance
counters equal one process's; a sequence rejected mid-draft leaves the state a plain step
then reads unchanged (its recurrent state rolled back on every rank)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from atlas_core.api import SamplingParams
from atlas_core.plugins import Registry
from atlas_core.testing.checkpoints import write_tiny_checkpoint
from atlas_core.testing.mtp_heads import add_mtp_head
from atlas_core.testing.parallel import finished_tokens, make_engine

pytestmark = pytest.mark.timeout(180)

MTP = {"method": "mtp", "num_speculative_tokens": 2, "draft_token_cost": 0.0}
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "draft_token_cost": 0.0}
MAX_TOKENS = 10
LOGPROB_ATOL = 1e-4


def _prompts():
    rng = np.random.default_rng(3)
    motif = rng.integers(0, 380, 5).tolist()
    # a repeated motif gives n-gram lookup something to draft; block_size 8 puts chained MTP
    # drafts across block boundaries
    return [motif * 3, rng.integers(0, 380, 9).tolist(), rng.integers(0, 380, 4).tolist()]


def _with_head(arch: str, path):
    registry = Registry()
    if arch not in registry.names("weight_loaders"):
        pytest.skip(f"no loader for {arch}: pip install --no-deps -e plugins/atlas-qwen35")
    write_tiny_checkpoint(arch, path, registry=registry)
    add_mtp_head(path, arch, registry.create("weight_loaders", arch, registry=registry), seed=11)
    return path


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("tpspec")
    return {"dense": _with_head("Qwen3_5ForCausalLM", root / "dense"),
            "moe": _with_head("Qwen3_5MoeForCausalLM", root / "moe")}


def _engine(path, tp=1, ep=False, spec=None):
    return make_engine(path, tp=tp, ep=ep, block_size=8, speculative_config=spec)


def _run(engine, proposer=None, logprobs=None):
    if proposer is not None:
        engine.speculator.proposer = proposer
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True,
                            logprobs=logprobs)
    for i, prompt in enumerate(_prompts()):
        engine.add_request(f"r{i}", prompt, params)
    out = finished_tokens(engine)
    stats = engine.stats().speculative
    return out, (stats and (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens))


def _split(path, spec, ep=False, proposer=None, logprobs=None):
    engine = _engine(path, tp=2, ep=ep, spec=spec)
    try:
        return _run(engine, proposer, logprobs)
    finally:
        engine.runner.shutdown()


def _tokens(out):
    return {k: v[0] for k, v in out.items()}


@pytest.fixture(scope="module")
def single(checkpoints):
    """One process: plain and MTP outputs of both checkpoints."""
    return {(name, spec is not None): _run(_engine(path, spec=spec))
            for name, path in checkpoints.items() for spec in (None, MTP)}


@pytest.fixture(scope="module")
def split_mtp(checkpoints):
    """The dense checkpoint split over two processes, drafting with its MTP head, and the
    outputs of its first run (:func:`_run`)."""
    engine = _engine(checkpoints["dense"], tp=2, spec=MTP)
    try:
        first = _run(engine)
        yield engine, first
    finally:
        engine.runner.shutdown()


@pytest.mark.parametrize("name, ep", [("dense", False), ("moe", True)])
def test_mtp_drafts_split_like_one_process(checkpoints, single, split_mtp, name, ep):
    plain, _ = single[(name, False)]
    one, one_stats = single[(name, True)]
    assert _tokens(one) == _tokens(plain)
    if name == "dense":
        got, stats = split_mtp[1]
    else:
        got, stats = _split(checkpoints[name], MTP, ep=ep)
    assert _tokens(got) == _tokens(plain)
    assert stats[1] > 0 and stats == one_stats


class _MidDraftRejection:
    """Drafts the known continuation with its second token wrong at even output lengths (one
    draft accepted, rejected in the middle) and nothing at odd ones, so a plain step follows
    every rejection. With ``head`` (an MTP proposer) the head still runs after every step and
    its own drafts are recorded in :attr:`head_drafts`."""

    def __init__(self, continuations: dict, vocab_size: int, head=None) -> None:
        self.continuations, self.vocab_size, self.head = continuations, vocab_size, head
        self.num_rejections = 0
        self.head_drafts: list[tuple] = []

    def propose(self, seq, num_tokens):
        if self.head is not None:
            self.head_drafts.append((seq.request_id, len(seq),
                                     tuple(self.head.propose(seq, num_tokens))))
        m = len(seq.output_token_ids)
        drafts = list(self.continuations[seq.request_id][m:m + num_tokens])
        if m % 2 or len(drafts) < 2:
            return []
        self.num_rejections += 1
        drafts[1] = (drafts[1] + 1) % self.vocab_size
        return drafts

    def observe(self, layout):
        if self.head is not None:
            self.head.observe(layout)


def _reject_mid_draft(engine, reference, with_head=False):
    """Outputs (with logprobs) and the drafter of a run rejecting drafts mid-way."""
    before = engine.speculator.snapshot().num_accepted_tokens
    drafter = _MidDraftRejection(_tokens(reference), engine.model.vocab_size,
                                 engine.speculator.proposer if with_head else None)
    out, stats = _run(engine, drafter, logprobs=1)
    assert drafter.num_rejections > 0 and stats[2] - before == drafter.num_rejections
    assert _tokens(out) == _tokens(reference)
    for rid, (_, logprobs) in reference.items():  # the plain steps after each rejection too
        assert out[rid][1] == pytest.approx(logprobs, abs=LOGPROB_ATOL)
    return drafter


def test_rejected_mid_draft_leaves_the_same_state(checkpoints, split_mtp):
    # hybrid: every rank rolls its Gated DeltaNet rows back; the MTP head then runs over the
    # accepted positions on every rank and drafts what one process's head drafts
    path = checkpoints["dense"]
    reference, _ = _run(_engine(path), logprobs=1)
    single_mtp = _engine(path, spec=MTP)
    _run(single_mtp)  # the same history as split_mtp's (prefix-cache hits change the steps)
    one = _reject_mid_draft(single_mtp, reference, with_head=True)
    split = _reject_mid_draft(split_mtp[0], reference, with_head=True)
    assert split.head_drafts == one.head_drafts
    assert any(d for _, _, d in one.head_drafts)


def test_ngram_drafts_split(checkpoints, single):
    path = checkpoints["dense"]
    one, one_stats = _run(_engine(path, spec=NGRAM))
    plain, _ = single[("dense", False)]
    assert _tokens(one) == _tokens(plain)
    engine = _engine(path, tp=2, spec=NGRAM)
    try:
        got, stats = _run(engine)
        assert _tokens(got) == _tokens(plain)
        assert stats[1] > 0 and stats == one_stats
        reference, _ = _run(_engine(path), logprobs=1)
        _reject_mid_draft(engine, reference)
    finally:
        engine.runner.shutdown()


def test_mtp_without_a_head_fails_before_any_worker_starts(tmp_path):
    path = write_tiny_checkpoint("Qwen3ForCausalLM", tmp_path / "q3")
    start = time.monotonic()
    with pytest.raises(ValueError, match="needs a checkpoint with an MTP head"):
        _engine(path, tp=2, spec=MTP)
    assert time.monotonic() - start < 5
