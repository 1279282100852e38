"""Recurrent-state slots and prefix snapshots: StateCache bookkeeping and the scheduler's
block-aligned prefill chunks (no model; the hybrid engine tests live in atlas-qwen35)."""

import pytest

from atlas_core.engine import SamplingParams
from atlas_core.engine.block_manager import BlockManager, block_hash
from atlas_core.engine.scheduler import Scheduler
from atlas_core.engine.sequence import Sequence
from atlas_core.engine.state_cache import StateCache


def seq(n, start=0):
    return Sequence("r", 0, list(range(start, start + n)), SamplingParams(max_tokens=4), 0)


def test_slots_are_assigned_and_released():
    cache = StateCache(num_slots=2)
    a, b, c = seq(3), seq(3), seq(3)
    assert {cache.assign(a), cache.assign(b)} == {0, 1}
    assert cache.assign(a) == a.state_slot                  # idempotent
    with pytest.raises(RuntimeError, match="no free recurrent-state slot"):
        cache.assign(c)
    cache.release(a)
    assert a.state_slot == -1 and cache.assign(c) in (0, 1)
    cache.release(a)                                        # no slot: no-op
    assert cache.num_free_slots == 0


def test_snapshots_are_lru_and_pinned_while_in_use():
    cache = StateCache(num_slots=1, num_snapshots=2)
    s = seq(3)
    cache.assign(s)
    h1, h2, h3 = b"1" * 16, b"2" * 16, b"3" * 16
    assert cache.save(s, h1) == (0, 1) and cache.save(s, h1) is None   # pending: deduplicated
    cache.complete_step()
    assert cache.save(s, h2) == (0, 2)
    cache.complete_step()
    s.block_hashes = [h1]
    assert cache.usable_blocks(s, 1) == 1
    assert cache.restore(s, 1) == (1, 0)                    # h1 is now the most recent
    assert cache.save(s, h3) == (0, 2)                      # evicts h2, not the pinned h1
    cache.complete_step()
    assert set(cache.row_of) == {h1, h3} and not cache.ref_counts
    assert cache.save(s, h1) is None                        # already cached
    s.block_hashes = [h2, h3]
    assert cache.usable_blocks(s, 2) == 2 and cache.usable_blocks(s, 1) == 0
    cache.reset()
    assert cache.num_cached_snapshots == 0 and len(cache.free_rows) == 2


def test_all_rows_pinned_skips_the_snapshot():
    cache = StateCache(num_slots=1, num_snapshots=1)
    s = seq(3)
    cache.assign(s)
    assert cache.save(s, b"a" * 16) is not None
    assert cache.save(s, b"b" * 16) is None


def make_scheduler(num_snapshots=4, budget=2048, caching=True):
    bm = BlockManager(32, 8, enable_prefix_caching=caching)
    return Scheduler(bm, 4, 4, budget, StateCache(4, num_snapshots))


def run_prefill(sched, s):
    sched.add(s)
    chunks, copies = [], []
    while True:
        out = sched.schedule()
        (scheduled,) = out.scheduled
        chunks.append((scheduled.start, scheduled.num_tokens))
        copies.append(out.snapshots)
        sched.complete_step(out)
        if scheduled.samples:
            break
    return chunks, copies


def test_prefill_chunks_end_on_snapshot_boundaries():
    sched = make_scheduler(budget=20)
    s = seq(37)
    chunks, copies = run_prefill(sched, s)
    assert chunks == [(0, 16), (16, 16), (32, 5)]
    assert copies == [[(s.state_slot, 4)], [(s.state_slot, 5)], []]
    hashes = s.block_hashes
    assert sched.state_cache.row_of == {hashes[1]: 4, hashes[3]: 5}
    assert hashes[3] == block_hash(hashes[2], list(range(24, 32)))


def test_one_shot_prefill_stops_at_the_last_boundary():
    sched = make_scheduler()
    chunks, _ = run_prefill(sched, seq(37))
    assert chunks == [(0, 32), (32, 5)]
    assert run_prefill(make_scheduler(), seq(33))[0] == [(0, 32), (32, 1)]
    assert run_prefill(make_scheduler(), seq(8))[0] == [(0, 8)]


def test_no_alignment_without_snapshots():
    for sched in (make_scheduler(num_snapshots=0), make_scheduler(caching=False)):
        chunks, copies = run_prefill(sched, seq(37))
        assert chunks == [(0, 37)] and copies == [[]]


def test_restore_is_planned_at_admission():
    sched = make_scheduler()
    first = seq(37)
    run_prefill(sched, first)
    sched.finish(first)
    again = seq(37)
    sched.add(again)
    out = sched.schedule()
    assert [(s.start, s.num_tokens) for s in out.scheduled] == [(32, 5)]
    assert out.restores == [(4, again.state_slot)]
    sched.complete_step(out)
    assert not sched.state_cache.ref_counts
