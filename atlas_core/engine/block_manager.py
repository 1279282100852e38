"""BlockManager: paged KV blocks with reference counts and a content-hashed prefix cache.

A full block is identified by a chained hash: ``H(parent_hash, its block_size token ids)``, so
equal hashes mean equal prefixes, not just equal blocks. Computed full blocks are registered
under their hash; later sequences with the same prefix take a reference instead of recomputing.
Blocks whose reference count drops to zero stay cached (and findable) until their memory is
needed, then the least recently freed are evicted first. With :attr:`BlockManager.tiers` set,
evicted blocks are copied to host memory / disk first, and a prefix that continues past the
device-cached blocks is read back from there instead of recomputed.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict, deque
from typing import Any, Callable

import numpy as np

from atlas_core.engine.sequence import Sequence


def block_hash(parent: bytes | None, token_ids: list[int]) -> bytes:
    """Chained content hash of one full block (16 bytes of SHA-256)."""
    h = hashlib.sha256(parent or b"atlas-kv")
    h.update(np.asarray(token_ids, dtype=np.int64).tobytes())
    return h.digest()[:16]


class BlockManager:
    """Allocates KV blocks ``0..num_blocks-1`` to sequences.

    Args:
        num_blocks: blocks in the KV pool.
        block_size: tokens per block.
        enable_prefix_caching: register computed full blocks and reuse them.
        tiers: lower tiers (:class:`~atlas_core.engine.kv_tiers.KVTiers`) evicted blocks
            spill to and prefixes are restored from, or ``None``.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 tiers: Any = None) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_counts = [0] * num_blocks
        self.hash_of: dict[int, bytes] = {}
        self.block_of: dict[bytes, int] = {}
        self.free_uncached: deque[int] = deque(range(num_blocks))
        self.free_cached: OrderedDict[int, None] = OrderedDict()
        self.num_hit_tokens = 0
        self.num_query_tokens = 0
        self.tiers = tiers
        self._evicted: list[tuple[int, bytes]] = []

    @property
    def num_free_blocks(self) -> int:
        """Blocks that can be handed out now (cached-but-unused ones included)."""
        return len(self.free_uncached) + len(self.free_cached)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    def blocks_needed(self, seq: Sequence, num_tokens: int) -> int:
        """New blocks ``seq`` needs to hold ``num_tokens`` tokens in total."""
        return max(0, -(-num_tokens // self.block_size) - len(seq.block_table))

    def _take(self) -> int:
        if self.free_uncached:
            block = self.free_uncached.popleft()
        else:
            block, _ = self.free_cached.popitem(last=False)
            h = self.hash_of.pop(block)
            del self.block_of[h]
            if self.tiers is not None:
                self._evicted.append((block, h))
        self.ref_counts[block] = 1
        return block

    def _ref(self, block: int) -> None:
        if self.ref_counts[block] == 0:
            self.free_cached.pop(block)
        self.ref_counts[block] += 1

    def match_prefix(self, seq: Sequence,
                     usable: Callable[[Sequence, int], int] | None = None) -> int:
        """Attach cached blocks of ``seq``'s leading full blocks; return the tokens reused.

        Only called for a sequence holding no blocks. The last token is never served from the
        cache (its logits are needed), so at most ``len(seq) - 1`` tokens are reused. Requests
        asking for prompt logprobs compute every prompt token. ``usable(seq, num_blocks)``
        may shorten the match (hybrid models: to a boundary with a recurrent-state snapshot).
        With tiers, the match goes on through blocks held in host memory (see :meth:`prefetch`),
        copied into newly taken device blocks.
        """
        assert not seq.block_table
        num_prefix = (len(seq) - 1) // self.block_size
        self.update_hashes(seq, len(seq) - 1)
        if not self.enable_prefix_caching or seq.params.prompt_logprobs is not None:
            return 0
        blocks = []
        for h in seq.block_hashes[:num_prefix]:
            block = self.block_of.get(h)
            if block is None:
                break
            blocks.append(block)
        available = len(blocks)
        if self.tiers is not None and available < num_prefix:
            available += self.tiers.num_in_memory(seq.block_hashes[available:num_prefix])
            if available < num_prefix:
                self.tiers.count_miss(seq.block_hashes[available])
        keep = usable(seq, available) if usable is not None and available else available
        for block in blocks[:keep]:
            self._ref(block)
            seq.block_table.append(block)
        if keep > len(blocks):
            self._restore(seq, seq.block_hashes[len(blocks):keep])
            if usable is not None and len(seq.block_table) < keep:
                self._trim(seq, usable(seq, len(seq.block_table)))
        seq.num_committed_blocks = len(seq.block_table)
        return len(seq.block_table) * self.block_size

    def prefetch(self, seq: Sequence) -> int | None:
        """Start reading ``seq``'s prefix blocks held by lower tiers only: ``None`` while some
        are in flight, else how many leading blocks the device and host memory hold now (0
        without tiers)."""
        if (self.tiers is None or not self.enable_prefix_caching or seq.block_table
                or seq.params.prompt_logprobs is not None):
            return 0
        self.update_hashes(seq, len(seq) - 1)
        hashes = seq.block_hashes[:(len(seq) - 1) // self.block_size]
        first = next((i for i, h in enumerate(hashes) if h not in self.block_of), len(hashes))
        more = self.tiers.prefetch(hashes[first:])
        return None if more is None else first + more

    def _trim(self, seq: Sequence, num_blocks: int) -> None:
        # Give back the blocks past ``num_blocks`` of a sequence still being matched (they
        # stay cached).
        while len(seq.block_table) > num_blocks:
            block = seq.block_table.pop()
            self.ref_counts[block] -= 1
            if self.ref_counts[block] == 0:
                self.free_cached[block] = None

    def _restore(self, seq: Sequence, hashes: list[bytes]) -> None:
        # Blocks past the device-cached prefix come back from host memory (disk reads were
        # staged there by prefetch); as many as free blocks allow.
        end = next((i for i, h in enumerate(hashes) if h in self.block_of), len(hashes))
        payloads = self.tiers.take(hashes[:min(end, self.num_free_blocks)])
        if not payloads:
            return
        blocks = [self._take() for _ in payloads]
        self.spill_evicted()
        self.tiers.write(blocks, payloads)
        for block, h in zip(blocks, hashes):
            self.hash_of[block] = h
            self.block_of[h] = block
            seq.block_table.append(block)

    def spill_evicted(self) -> None:
        """Copy the blocks evicted since the last call to the lower tiers (before reuse)."""
        if self._evicted:
            evicted, self._evicted = self._evicted, []
            self.tiers.spill(evicted)

    def flush_to_tiers(self) -> None:
        """Copy every device-cached block to the lower tiers (at shutdown: disk persists)."""
        if self.tiers is not None:
            self.tiers.spill(sorted(self.hash_of.items()))

    def record_lookup(self, num_tokens: int, num_hit_tokens: int) -> None:
        """Count one admitted sequence's prefix-cache lookup (tokens looked up / reused)."""
        self.num_query_tokens += num_tokens
        self.num_hit_tokens += num_hit_tokens

    def can_allocate(self, seq: Sequence, num_tokens: int) -> bool:
        return self.blocks_needed(seq, num_tokens) <= self.num_free_blocks

    def allocate(self, seq: Sequence, num_tokens: int) -> None:
        """Grow ``seq``'s block table to hold ``num_tokens`` tokens."""
        need = self.blocks_needed(seq, num_tokens)
        if need > self.num_free_blocks:
            raise RuntimeError(f"out of KV blocks: need {need}, {self.num_free_blocks} free")
        seq.block_table.extend(self._take() for _ in range(need))
        self.spill_evicted()

    def commit(self, seq: Sequence) -> None:
        """Register ``seq``'s computed full blocks in the prefix cache."""
        if not self.enable_prefix_caching:
            return
        num_full = seq.num_computed_tokens // self.block_size
        self.update_hashes(seq, seq.num_computed_tokens)
        for i in range(seq.num_committed_blocks, num_full):
            block, h = seq.block_table[i], seq.block_hashes[i]
            if block not in self.hash_of and h not in self.block_of:
                self.hash_of[block] = h
                self.block_of[h] = block
        seq.num_committed_blocks = max(seq.num_committed_blocks, num_full)

    def update_hashes(self, seq: Sequence, num_tokens: int) -> None:
        """Extend ``seq.block_hashes`` over the full blocks of its first ``num_tokens`` tokens."""
        bs = self.block_size
        for i in range(len(seq.block_hashes), num_tokens // bs):
            parent = seq.block_hashes[i - 1] if i else None
            tokens = seq.tokens_range(i * bs, (i + 1) * bs)
            if seq.mm is not None:
                tokens = seq.mm.hash_tokens(i * bs, tokens)
            seq.block_hashes.append(block_hash(parent, tokens))

    def free(self, seq: Sequence) -> None:
        """Drop ``seq``'s references; unreferenced blocks become free (cached ones stay findable)."""
        for block in reversed(seq.block_table):
            self.ref_counts[block] -= 1
            if self.ref_counts[block] == 0:
                if block in self.hash_of:
                    self.free_cached[block] = None
                else:
                    self.free_uncached.append(block)
        seq.block_table = []
        seq.num_committed_blocks = 0
        seq.table_epoch += 1

    def reset_prefix_cache(self) -> None:
        """Forget every cached block that no sequence holds."""
        for block in list(self.free_cached):
            del self.block_of[self.hash_of.pop(block)]
            self.free_uncached.append(block)
        self.free_cached.clear()
