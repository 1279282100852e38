"""Sliding-window KV blocks: a second, smaller block pool for layers that only look back a window.

Layers whose state is a :class:`~atlas_core.interfaces.layer.SlidingWindowCacheSpec` (Gemma's
local layers) never read a key more than ``window - 1`` positions before their query. Their K/V
live in a pool of their own, addressed through a second block table per sequence
(``Sequence.window_block_table``, uploaded as ``StepMetadata.window_block_tables`` /
``window_slot_mapping``). Once a sequence has computed ``c`` tokens its next query is at
position ``c`` or later, so every window block wholly before ``c - window + 1`` is given back:
a 32k-token context holds about ``window / block_size`` blocks of each sliding layer instead of
2,048.

Both tables always have the same length (a block of each pool per block of context), so a
sequence needs as many new blocks of one pool as of the other, and the manager reports the
smaller free count: scheduling, preemption and look-ahead checks see whichever pool is short.
Prefix caching keeps working: window blocks are content-hashed like the others, and a prefix hit
needs, besides the full-attention blocks, the window blocks the first recomputed token looks
back on.

KV tiers (``--kv-host-gb`` / ``--kv-offload-dir``) get one record per pool and block: the
window pool has tiers of its own (``window_pool.tiers``, the main tiers' ``window``), keyed by
the same block hashes, with its own disk namespace. A window block evicted from the device
cache spills there as a full-attention block does to the main tiers, and a cached prefix of
``k`` blocks is usable when its ``k`` full-attention blocks and its window blocks from
:meth:`WindowedBlockManager.first_needed_block` to ``k`` are each on the device or in a tier;
anything shorter is recomputed, so a restored prefix computes what a cold prefill would.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from atlas_core.engine.block_manager import BlockManager
from atlas_core.engine.kv_layers import kv_bytes_per_token
from atlas_core.engine.sequence import Sequence
from atlas_core.interfaces.layer import KVCacheSpec, SlidingWindowCacheSpec

#: Window-table entry of a block the sequence does not hold (before its window).
NO_BLOCK = -1


def is_windowed(spec: Any) -> bool:
    """Whether ``spec`` is a paged-KV spec that only looks back ``sliding_window`` positions."""
    return isinstance(spec, SlidingWindowCacheSpec) and spec.sliding_window > 0


@dataclass(frozen=True)
class WindowPool:
    """The planned sliding-window pool.

    Attributes:
        window: the longest window of the windowed layers (they share one pool and table).
        num_blocks: blocks in the pool.
        bytes_per_block: bytes one block takes across every windowed layer (K and V).
    """

    window: int
    num_blocks: int
    bytes_per_block: int


def plan_window_pool(specs: list, args: Any, block_size: int, dtype: Any, max_seq_len: int,
                     budget: int) -> WindowPool | None:
    """The window pool ``specs`` call for, or None (no windowed layer, or only windowed layers).
    ``dtype``: the KV storage dtype, or one per entry of ``specs``.

    Blocks: enough for every running sequence's window plus three (partial blocks at both ends,
    one decode token planned ahead), capped at a whole ``max_seq_len`` sequence, plus one step's
    prefill chunks and decode rows. When that is more than half of ``budget`` (bytes for both
    pools), the pool gets half: fewer sequences run at once, and the full-attention half still
    holds long contexts (gemma-4-31b on an 80 GB card: a 32k context fits, 4 window-long
    sequences at once).
    """
    windowed = [s for s in specs if is_windowed(s)]
    if not windowed or all(is_windowed(s) for s in specs if isinstance(s, KVCacheSpec)):
        return None
    window = max(int(s.sliding_window) for s in windowed)
    per_seq = min(-(-(window - 1) // block_size) + 3, -(-max_seq_len // block_size) + 1)
    step = -(-(args.max_prefill_tokens + (args.max_batch_size or args.max_num_seqs))
             // block_size)
    dtypes = ([d for s, d in zip(specs, dtype) if is_windowed(s)]
              if isinstance(dtype, (list, tuple)) else dtype)
    block_bytes = max(1, kv_bytes_per_token(windowed, dtypes) * block_size)
    share = max(0, budget) // 2 // block_bytes
    if share < per_seq + step:
        raise ValueError(
            f"the sliding-window KV pool needs at least {per_seq + step} blocks "
            f"({(per_seq + step) * block_bytes / (1 << 20):.0f} MiB: one window of {window} "
            f"tokens and one step) but its share of the memory left holds {share}; raise "
            "--gpu-memory-utilization or lower --max-prefill-tokens")
    return WindowPool(window, min(args.max_num_seqs * per_seq + step, share), block_bytes)


class WindowedBlockManager(BlockManager):
    """A :class:`BlockManager` for the full-attention layers plus the window pool.

    Every method the scheduler calls keeps the two tables in step: :meth:`allocate` grows the
    window table as far as the main one, :meth:`commit` registers full window blocks in the
    window pool's prefix cache and gives back those behind the window, :meth:`free` drops both,
    :meth:`match_prefix` shortens a hit to a prefix whose window blocks are cached too. With
    tiers, ``window_pool.tiers`` holds the window blocks evicted from the device:
    :meth:`prefetch` and :meth:`match_prefix` bring back the ones a hit resumes from.

    Args:
        num_blocks, block_size, enable_prefix_caching: as :class:`BlockManager`.
        pool: the planned window pool.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool,
                 pool: WindowPool) -> None:
        super().__init__(num_blocks, block_size, enable_prefix_caching)
        self.window = pool.window
        self.window_pool = BlockManager(pool.num_blocks, block_size, enable_prefix_caching)
        # seq_id -> window blocks registered in the prefix cache / first block still held
        self._window_committed: dict[int, int] = {}
        self._window_first: dict[int, int] = {}

    def first_needed_block(self, num_tokens: int) -> int:
        """First window block a query at position ``num_tokens`` (or later) reads."""
        return max(0, num_tokens - self.window + 1) // self.block_size

    @property
    def num_free_blocks(self) -> int:
        """Blocks of context that can be handed out now: the smaller of the two pools' counts."""
        return min(super().num_free_blocks, self.window_pool.num_free_blocks)

    @property
    def num_used_blocks(self) -> int:
        """Full-attention blocks in use."""
        return self.num_blocks - len(self.free_uncached) - len(self.free_cached)

    def allocate(self, seq: Sequence, num_tokens: int) -> None:
        size = max(len(seq.block_table), -(-num_tokens // self.block_size))
        need, pool = size - len(seq.window_block_table), self.window_pool
        if need > pool.num_free_blocks:
            raise RuntimeError(f"out of sliding-window KV blocks: need {need}, "
                               f"{pool.num_free_blocks} free")
        super().allocate(seq, num_tokens)
        seq.window_block_table.extend(pool._take() for _ in range(need))
        pool.spill_evicted()

    def commit(self, seq: Sequence) -> None:
        super().commit(seq)
        table, pool, bs = seq.window_block_table, self.window_pool, self.block_size
        num_full = min(seq.num_computed_tokens // bs, len(table))
        start = self._window_committed.get(seq.seq_id, 0)
        if self.enable_prefix_caching:
            for i in range(start, num_full):
                block, h = table[i], seq.block_hashes[i]
                if block != NO_BLOCK and block not in pool.hash_of and h not in pool.block_of:
                    pool.hash_of[block] = h
                    pool.block_of[h] = block
        self._window_committed[seq.seq_id] = max(start, num_full)
        first = self.first_needed_block(seq.num_computed_tokens)
        for i in range(self._window_first.get(seq.seq_id, 0), first):
            if table[i] != NO_BLOCK:
                self._release(table[i])
                table[i] = NO_BLOCK
        self._window_first[seq.seq_id] = max(first, self._window_first.get(seq.seq_id, 0))

    def _release(self, block: int) -> None:
        pool = self.window_pool
        pool.ref_counts[block] -= 1
        if pool.ref_counts[block] == 0:
            if block in pool.hash_of:
                pool.free_cached[block] = None
            else:
                pool.free_uncached.append(block)

    def free(self, seq: Sequence) -> None:
        self._free_window(seq)
        self._window_committed.pop(seq.seq_id, None)
        self._window_first.pop(seq.seq_id, None)
        super().free(seq)

    def _resumable(self, seq: Sequence, num_blocks: int, has: Callable[[bytes], bool]) -> int:
        # Longest prefix of at most ``num_blocks`` blocks whose window blocks all pass ``has``.
        # A failing block j rules out every prefix that reads it, i.e. those longer than j.
        while num_blocks:
            first = self.first_needed_block(num_blocks * self.block_size)
            gap = next((j for j in range(num_blocks - 1, first - 1, -1)
                        if not has(seq.block_hashes[j])), None)
            if gap is None:
                return num_blocks
            num_blocks = gap
        return 0

    def prefetch(self, seq: Sequence) -> int | None:
        """As :meth:`BlockManager.prefetch`, then start reading the window blocks that the
        longest prefix the tiers can rebuild resumes from (``None`` while some are read)."""
        available = super().prefetch(seq)
        pool, tiers = self.window_pool, self.window_pool.tiers
        if not available or tiers is None:
            return available
        num_blocks = self._resumable(seq, available,
                                     lambda h: h in pool.block_of or tiers.holds(h))
        first = self.first_needed_block(num_blocks * self.block_size)
        todo = [h for h in seq.block_hashes[first:num_blocks] if h not in pool.block_of]
        return None if todo and tiers.prefetch(todo) is None else available

    def _window_usable(self, seq: Sequence, num_blocks: int) -> int:
        # Longest prefix of at most ``num_blocks`` blocks whose window blocks are on the device
        # or in the window tiers' memory, with room in the window pool for the latter.
        pool, tiers = self.window_pool, self.window_pool.tiers

        def has(h: bytes) -> bool:
            return h in pool.block_of or (tiers is not None and tiers.num_in_memory([h]) == 1)

        num_blocks = self._resumable(seq, num_blocks, has)
        while num_blocks:
            first = self.first_needed_block(num_blocks * self.block_size)
            found = [pool.block_of.get(h) for h in seq.block_hashes[first:num_blocks]]
            idle = sum(b is not None and not pool.ref_counts[b] for b in found)
            if found.count(None) <= pool.num_free_blocks - idle:
                return num_blocks
            num_blocks = self._resumable(seq, num_blocks - 1, has)
        return 0

    def _attach_window(self, seq: Sequence, num_blocks: int) -> int:
        # Window table of a sequence matched to ``num_blocks`` blocks: NO_BLOCK before its
        # window, then device-cached blocks (referenced) and blocks copied in from the window
        # tiers. Returns ``num_blocks``, or 0 (nothing attached) if a tier came up short.
        pool, bs = self.window_pool, self.block_size
        first = self.first_needed_block(num_blocks * bs) if num_blocks else 0
        table = [NO_BLOCK] * first
        for h in seq.block_hashes[first:num_blocks]:
            block = pool.block_of.get(h, NO_BLOCK)
            if block != NO_BLOCK:
                pool._ref(block)
            table.append(block)
        seq.window_block_table = table
        missing = [i for i in range(first, num_blocks) if table[i] == NO_BLOCK]
        if not missing:
            return num_blocks
        payloads = pool.tiers.take([seq.block_hashes[i] for i in missing])
        if len(payloads) < len(missing):
            self._free_window(seq)
            return 0
        blocks = [pool._take() for _ in payloads]
        pool.spill_evicted()
        pool.tiers.write(blocks, payloads)
        for i, block in zip(missing, blocks):
            pool.hash_of[block] = seq.block_hashes[i]
            pool.block_of[seq.block_hashes[i]] = block
            table[i] = block
        return num_blocks

    def _free_window(self, seq: Sequence) -> None:
        for block in reversed(seq.window_block_table):
            if block != NO_BLOCK:
                self._release(block)
        seq.window_block_table = []

    def match_prefix(self, seq: Sequence,
                     usable: Callable[[Sequence, int], int] | None = None) -> int:
        """As :meth:`BlockManager.match_prefix`, shortened to the longest matched prefix whose
        window blocks (those its first recomputed token looks back on) are cached too, on the
        device or in the window tiers' memory (copied into new window blocks)."""

        def fits(s: Sequence, num_blocks: int) -> int:
            num_blocks = usable(s, num_blocks) if usable is not None else num_blocks
            return self._window_usable(s, num_blocks)

        bs = self.block_size
        num_blocks = self._attach_window(seq, super().match_prefix(seq, fits) // bs)
        if num_blocks < len(seq.block_table):
            self._trim(seq, num_blocks)
            seq.num_committed_blocks = len(seq.block_table)
        self._window_committed[seq.seq_id] = num_blocks
        self._window_first[seq.seq_id] = self.first_needed_block(num_blocks * bs)
        return num_blocks * bs

    def spill_evicted(self) -> None:
        super().spill_evicted()
        self.window_pool.spill_evicted()

    def flush_to_tiers(self) -> None:
        super().flush_to_tiers()
        self.window_pool.flush_to_tiers()

    def reset_prefix_cache(self) -> None:
        super().reset_prefix_cache()
        self.window_pool.reset_prefix_cache()
