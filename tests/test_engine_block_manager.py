"""BlockManager: allocation, reference counts, chained prefix hashes, LRU eviction."""

from atlas_core.engine.block_manager import BlockManager, block_hash
from atlas_core.engine.sampling_params import SamplingParams
from atlas_core.engine.sequence import Sequence


def seq(tokens):
    return Sequence("r", 0, tokens, SamplingParams(), seed=0)


def computed(bm, s):
    bm.allocate(s, len(s))
    s.num_computed_tokens = len(s)
    bm.commit(s)


def test_allocate_and_free_every_block():
    bm = BlockManager(8, 4)
    a, b = seq(list(range(10))), seq(list(range(100, 105)))
    bm.allocate(a, 10)
    bm.allocate(b, 5)
    assert len(a.block_table) == 3 and len(b.block_table) == 2 and bm.num_free_blocks == 3
    assert set(a.block_table).isdisjoint(b.block_table)
    bm.allocate(a, 12)
    assert len(a.block_table) == 3
    bm.free(a)
    bm.free(b)
    assert bm.num_free_blocks == 8 and all(r == 0 for r in bm.ref_counts)


def test_chained_hash_depends_on_prefix():
    h1 = block_hash(None, [1, 2, 3, 4])
    assert block_hash(h1, [5, 6, 7, 8]) != block_hash(block_hash(None, [0, 2, 3, 4]), [5, 6, 7, 8])
    assert block_hash(h1, [5, 6, 7, 8]) == block_hash(block_hash(None, [1, 2, 3, 4]), [5, 6, 7, 8])


def test_prefix_hit_shares_blocks_and_refcounts():
    bm = BlockManager(8, 4)
    a = seq(list(range(10)))
    computed(bm, a)
    b = seq(list(range(8)) + [50, 51, 52])
    assert bm.match_prefix(b) == 8
    assert b.block_table == a.block_table[:2]
    assert bm.ref_counts[a.block_table[0]] == 2
    bm.free(a)
    assert bm.ref_counts[b.block_table[0]] == 1
    bm.free(b)
    assert bm.num_free_blocks == 8


def test_last_token_is_never_cached():
    bm = BlockManager(8, 4)
    a = seq(list(range(8)))
    computed(bm, a)
    again = seq(list(range(8)))
    assert bm.match_prefix(again) == 4


def test_freed_blocks_stay_cached_then_lru_evicted():
    bm = BlockManager(4, 4)
    a, b = seq(list(range(5))), seq(list(range(20, 25)))
    computed(bm, a)
    computed(bm, b)
    bm.free(a)
    bm.free(b)
    assert bm.num_free_blocks == 4
    hit = seq(list(range(5)))
    assert bm.match_prefix(hit) == 4
    bm.free(hit)
    # Two uncached blocks, then the least recently used cached block (b's) is evicted.
    c = seq(list(range(40, 52)))
    bm.allocate(c, 12)
    assert bm.match_prefix(seq(list(range(20, 25)))) == 0
    bm.free(c)
    assert bm.match_prefix(seq(list(range(5)))) == 4


def test_prefix_caching_disabled():
    bm = BlockManager(8, 4, enable_prefix_caching=False)
    a = seq(list(range(9)))
    computed(bm, a)
    assert bm.match_prefix(seq(list(range(9)))) == 0


def test_reset_prefix_cache():
    bm = BlockManager(4, 4)
    a = seq(list(range(9)))
    computed(bm, a)
    bm.free(a)
    bm.reset_prefix_cache()
    assert not bm.block_of and bm.num_free_blocks == 4
