"""Async scheduling: outputs identical to the synchronous engine, the launch-before-read order and
GPU discipline on the mock, fallbacks, and no leaked blocks."""

import pytest

from atlas_core.engine import EngineArgs, LLMEngine, SamplingParams
from atlas_core.testing.fake_model import FakeCausalLM, make_fake_engine
from atlas_core.plugins import Registry
from atlas_core.testing.checkpoints import write_tiny_checkpoint
from atlas_core.testing.tiny_tokenizer import write_tokenizer
from atlas_core.tokenizer import Tokenizer

pytestmark = pytest.mark.timeout(120)

EOS = {7, 61, 99, 150, 201, 333}


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok")
    write_tokenizer(path, 384)
    return Tokenizer.from_dir(path)


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory):
    return write_tiny_checkpoint("Qwen3ForCausalLM", tmp_path_factory.mktemp("qwen3"))


def fake_engine(tok, async_scheduling, backend="numpy", **kwargs):
    model = FakeCausalLM(Registry().create("gpu_backends", backend), vocab_size=384)
    return make_fake_engine(model, tokenizer=tok, eos_token_ids=EOS,
                            async_scheduling=async_scheduling, **kwargs)


def prompt(i: int, n: int) -> list[int]:
    return [(37 * i + 11 * k) % 380 + 1 for k in range(n)]


REQUESTS = [
    (3, dict(temperature=0, max_tokens=9)),
    (17, dict(temperature=1.0, seed=5, max_tokens=12)),
    (1, dict(temperature=0.8, top_p=0.9, max_tokens=20, stop=["e", "q"])),
    (40, dict(temperature=1.0, n=3, seed=2, max_tokens=7)),
    (6, dict(temperature=0, max_tokens=15, ignore_eos=True, min_tokens=4)),
    (9, dict(temperature=1.0, max_tokens=11, repetition_penalty=1.3)),
    (12, dict(temperature=0, max_tokens=8, logprobs=2)),
    (25, dict(temperature=0.7, max_tokens=10, thinking_budget=2,
              thinking_end_token_ids=[300, 301])),
    (2, dict(temperature=1.0, max_tokens=1)),
]


def drive(engine, requests=REQUESTS, abort=None, stagger=True):
    """Add ``requests`` (one per step when ``stagger``), step to the end; return every step's
    outputs (an arrival joins one step later under async scheduling: compare with
    :func:`streams` then)."""
    pending = [(f"r{i}", prompt(i, n), SamplingParams(**p)) for i, (n, p) in enumerate(requests)]
    steps = []
    while pending or engine.has_unfinished_requests():
        while pending:
            engine.add_request(*pending.pop(0))
            if stagger:
                break
        if abort and len(steps) == abort[1]:
            engine.abort_request(abort[0])
        steps.append([(o.request_id, [(c.new_token_ids, c.new_text, c.finish_reason, c.stop_reason)
                                      for c in o.outputs]) for o in engine.step()])
    return steps


def streams(steps) -> dict:
    """Per request and completion: every streamed token and character, and how it ended."""
    out: dict = {}
    for step in steps:
        for rid, completions in step:
            acc = out.setdefault(rid, [[[], "", None, None] for _ in completions])
            for a, (ids, text, reason, stop) in zip(acc, completions):
                a[0] += ids
                a[1] += text
                a[2:] = reason or a[2], stop or a[3]
    return out


def assert_drained(engine):
    assert engine.block_manager.num_used_blocks == 0
    assert not engine.scheduler.running and not engine.scheduler.waiting


CHAINABLE = REQUESTS[:5] + REQUESTS[-1:]


@pytest.mark.parametrize("requests", [CHAINABLE, REQUESTS], ids=["chainable", "all"])
@pytest.mark.parametrize("kwargs", [{}, {"enable_prefix_caching": False},
                                    {"num_kv_blocks": 14, "block_size": 4},
                                    {"max_batch_size": 2}])
def test_outputs_identical_to_sync(tok, kwargs, requests):
    sync, overlapped = fake_engine(tok, False, **kwargs), fake_engine(tok, True, **kwargs)
    a, b = drive(sync, requests), drive(overlapped, requests)
    assert streams(a) == streams(b)
    assert sync.runner.num_chained_steps == 0
    if requests is CHAINABLE and "max_batch_size" not in kwargs:
        # Preemption keeps sequences waiting, so few steps run ahead there.
        least = 1 if "num_kv_blocks" in kwargs else overlapped.stats().num_steps // 3
        assert overlapped.runner.num_chained_steps >= least
    assert overlapped.scheduler.num_preemptions == sync.scheduler.num_preemptions
    for engine in (sync, overlapped):
        assert_drained(engine)
    if "num_kv_blocks" in kwargs:
        assert sync.scheduler.num_preemptions > 0


def test_abort_mid_stream(tok):
    steps = [drive(fake_engine(tok, flag), abort=("r3", 6), stagger=False) for flag in (False, True)]
    assert steps[0] == steps[1]
    seen = [i for i, step in enumerate(steps[1]) for rid, _ in step if rid == "r3"]
    assert seen and max(seen) == 5  # streamed until the abort, nothing from the step in flight


def test_stop_drops_the_token_in_flight(tok):
    params = [(5, dict(temperature=1.0, seed=s, max_tokens=40)) for s in range(6)]
    sync, overlapped = fake_engine(tok, False), fake_engine(tok, True)
    a, b = drive(sync, params, stagger=False), drive(overlapped, params, stagger=False)
    assert a == b
    reasons = [c[2] for step in b for _, cs in step for c in cs if c[2]]
    assert "stop" in reasons and overlapped.runner.num_chained_steps > 10
    assert overlapped.stats().num_generation_tokens == sync.stats().num_generation_tokens
    assert_drained(overlapped)


def test_default_follows_supports_graphs(tok):
    assert fake_engine(tok, None).async_scheduling is False
    assert fake_engine(tok, None, backend="mock").async_scheduling is True
    assert fake_engine(tok, False, backend="mock").async_scheduling is False


def mock_engine(qwen3_dir, flag):
    return LLMEngine.from_args(EngineArgs(model=str(qwen3_dir), backend="mock", num_kv_blocks=64,
                                          max_num_seqs=4, async_scheduling=flag))


def test_mock_launches_next_step_before_reading(qwen3_dir):
    engine = mock_engine(qwen3_dir, True)
    backend = engine.backend
    for i in range(3):
        engine.add_request(f"r{i}", [5 + i, 17, 33], SamplingParams(
            max_tokens=8, ignore_eos=True, temperature=0.7, seed=i))
    engine.step()
    engine.step()  # first decode: launches two steps, reads one
    for _ in range(5):
        with backend.record() as rec:
            outs = engine.step()
        kinds = [e.kind for e in rec.events]
        assert len(outs) == 3
        assert rec.count("graph_launch") == 1 and rec.count("launch") == 0
        assert rec.host_syncs == 1 and rec.count("sync") == 0
        assert kinds.index("graph_launch") < kinds.index("d2h")
        assert rec.count("d2d") == 1  # the sampled ids chained into the next input, on the device
        assert rec.count("alloc") == 0, rec.names("alloc")
    with backend.record() as rec:
        engine.step()  # last token: nothing new launched
    assert rec.count("graph_launch") == 0 and rec.host_syncs == 1
    assert not engine.has_unfinished_requests() and engine.step() == []
    assert engine.block_manager.num_used_blocks == 0


def test_mock_matches_sync(qwen3_dir):
    outs = []
    for flag in (False, True):
        engine = mock_engine(qwen3_dir, flag)
        outs.append(streams(drive(engine, REQUESTS[:5])))
        assert_drained(engine)
    assert outs[0] == outs[1]


def test_schedule_ahead_allocates_or_changes_nothing():
    from atlas_core.engine.block_manager import BlockManager
    from atlas_core.engine.scheduler import Scheduler
    from atlas_core.engine.sequence import Sequence

    bm = BlockManager(3, 4, enable_prefix_caching=False)
    sch = Scheduler(bm, max_num_seqs=4, max_batch_size=4, max_prefill_tokens=64)
    seqs = [Sequence(f"s{i}", 0, [1, 2, 3], SamplingParams(max_tokens=9), 0) for i in range(2)]
    for seq in seqs:
        sch.add(seq)
    first = sch.schedule()
    sch.complete_step(first)
    for seq in seqs:
        seq.output_token_ids.append(5)  # len 4: the next decode step fills block 0
    step = sch.schedule()
    assert [s.start for s in step.scheduled] == [3, 3]
    ahead = sch.schedule_ahead(step, seqs)  # positions 4: one new block each, only one free
    assert ahead is None and [len(s.block_table) for s in seqs] == [1, 1]
    ahead = sch.schedule_ahead(step, seqs[:1])
    assert [(s.start, s.num_tokens) for s in ahead.scheduled] == [(4, 1)]
    assert len(seqs[0].block_table) == 2 and bm.num_free_blocks == 0
    sch.add(Sequence("w", 0, [1], SamplingParams(), 0))
    assert sch.schedule_ahead(step, seqs[:1]) is None  # a waiting request needs a sync step
