"""StateCache: recurrent-state slots of running sequences and prefix snapshots (hybrid models).

Every recurrent layer's state pool (conv + SSM) has ``num_slots + num_snapshots`` rows. Rows
``0..num_slots-1`` are live slots: a running sequence owns one from admission until it finishes,
is aborted or is preempted, and the layers update it in place (``StepMetadata.state_indices``).
The other rows hold snapshots: copies of a slot taken when a prefill chunk ends on a block
boundary, keyed by the chained hash of the block ending there (the same key as the KV block).
A waiting sequence whose cached KV prefix reaches a snapshotted boundary restores the snapshot
into its slot and skips the prefix's prefill. Snapshots are reference-counted while a copy from
or into them is pending in the current step, and evicted least recently used first.

With :attr:`StateCache.tiers` set (:class:`~atlas_core.engine.kv_tiers.KVTiers` over the state
pools), an evicted snapshot is first copied to host memory / disk, and a boundary whose snapshot
is there counts as usable: :meth:`StateCache.restore` then writes it straight into the slot.

This class only does the bookkeeping; the copies are listed on the
:class:`~atlas_core.engine.scheduler.SchedulerOutput` (``restores`` before the forward,
``snapshots`` after it) and issued by the model runner with ``backend.copy_``.
"""

from __future__ import annotations

from collections import OrderedDict, deque

from atlas_core.engine.sequence import Sequence


class StateCache:
    """Slot and snapshot bookkeeping of the recurrent-state pools.

    Args:
        num_slots: live slots (the engine's ``max_num_seqs``).
        num_snapshots: snapshot rows (0 turns hybrid prefix caching off).
    """

    def __init__(self, num_slots: int, num_snapshots: int = 0) -> None:
        self.num_slots = num_slots
        self.num_snapshots = num_snapshots
        self.free_slots = list(range(num_slots - 1, -1, -1))
        self.free_rows: deque[int] = deque(range(num_slots, num_slots + num_snapshots))
        self.row_of: OrderedDict[bytes, int] = OrderedDict()
        self.ref_counts: dict[int, int] = {}
        self.pending_saves: dict[bytes, int] = {}
        self.pending_restores: list[int] = []
        self.num_restores = 0
        self.tiers = None

    @property
    def num_free_slots(self) -> int:
        return len(self.free_slots)

    @property
    def num_cached_snapshots(self) -> int:
        return len(self.row_of)

    def assign(self, seq: Sequence) -> int:
        """Give ``seq`` a live slot (one is always free while ``running < max_num_seqs``)."""
        if seq.state_slot < 0:
            if not self.free_slots:
                raise RuntimeError("no free recurrent-state slot; running sequences exceed "
                                   f"max_num_seqs ({self.num_slots})")
            seq.state_slot = self.free_slots.pop()
        return seq.state_slot

    def release(self, seq: Sequence) -> None:
        """Return ``seq``'s slot (finish, abort, preemption); no-op when it holds none."""
        if seq.state_slot >= 0:
            self.free_slots.append(seq.state_slot)
            seq.state_slot = -1

    def usable_blocks(self, seq: Sequence, num_blocks: int) -> int:
        """Longest prefix of ``num_blocks`` KV-cached blocks that ends at a snapshot (0: none)."""
        if not self.num_snapshots:
            return 0
        for k in range(num_blocks, 0, -1):
            h = seq.block_hashes[k - 1]
            if h in self.row_of or (self.tiers is not None and self.tiers.num_in_memory([h])):
                return k
        return 0

    def prefetch(self, seq: Sequence, num_blocks: int) -> bool:
        """Start reading the snapshot of the longest of ``seq``'s first ``num_blocks`` block
        boundaries that has one in a lower tier; True unless that read is in flight."""
        if self.tiers is None or not self.num_snapshots:
            return True
        for k in range(num_blocks, 0, -1):
            h = seq.block_hashes[k - 1]
            if h in self.row_of:
                return True
            found = self.tiers.prefetch([h])
            if found is None:
                return False
            if found:
                return True
        return True

    def restore(self, seq: Sequence, num_blocks: int) -> tuple[int, int] | None:
        """Plan the copy of the snapshot ending at block ``num_blocks`` into ``seq``'s slot.

        Returns ``(snapshot_row, slot)``; the row stays referenced until :meth:`complete_step`.
        A snapshot found in the lower tiers only is written into the slot now (``None``).
        """
        h = seq.block_hashes[num_blocks - 1]
        if h not in self.row_of:
            [payload] = self.tiers.take([h])
            slot = self.assign(seq)
            self.tiers.write([slot], [payload])
            self.num_restores += 1
            return None
        row = self.row_of[h]
        self.row_of.move_to_end(h)
        self._ref(row)
        self.pending_restores.append(row)
        self.num_restores += 1
        return row, self.assign(seq)

    def save(self, seq: Sequence, block_hash: bytes) -> tuple[int, int] | None:
        """Plan a snapshot of ``seq``'s slot under ``block_hash`` after this step's forward.

        Returns ``(slot, snapshot_row)``, or ``None`` when the boundary is already snapshotted
        (it becomes the most recently used) or every row is in use this step.
        """
        if block_hash in self.row_of:
            self.row_of.move_to_end(block_hash)
            return None
        if block_hash in self.pending_saves:
            return None
        row = self._take_row()
        if row is None:
            return None
        self._ref(row)
        self.pending_saves[block_hash] = row
        return seq.state_slot, row

    def complete_step(self) -> None:
        """The step's copies are issued: publish its snapshots, drop its references."""
        for h, row in self.pending_saves.items():
            self.row_of[h] = row
            self._unref(row)
        for row in self.pending_restores:
            self._unref(row)
        self.pending_saves.clear()
        self.pending_restores.clear()

    def cancel(self, copies: list[tuple[int, int]] | None = None) -> None:
        """Drop planned snapshots whose forward will not run (a failed step or sequence), so
        they are never published; ``None`` drops the whole step's saves and restores."""
        rows = None if copies is None else {row for _, row in copies}
        for h, row in list(self.pending_saves.items()):
            if rows is None or row in rows:
                del self.pending_saves[h]
                self._unref(row)
                if row not in self.ref_counts:
                    self.free_rows.append(row)
        if copies is None:
            for row in self.pending_restores:
                self._unref(row)
            self.pending_restores.clear()

    def reset(self) -> None:
        """Forget every snapshot not in use this step."""
        for h, row in list(self.row_of.items()):
            if not self.ref_counts.get(row):
                del self.row_of[h]
                self.free_rows.append(row)

    def _take_row(self) -> int | None:
        if self.free_rows:
            return self.free_rows.popleft()
        for h, row in self.row_of.items():
            if not self.ref_counts.get(row):
                del self.row_of[h]
                if self.tiers is not None:
                    self.tiers.spill([(row, h)])
                return row
        return None

    def flush_to_tiers(self) -> None:
        """Copy every snapshot to the lower tiers (at shutdown: the disk tier keeps them)."""
        if self.tiers is not None:
            self.tiers.spill(sorted((row, h) for h, row in self.row_of.items()))

    def _ref(self, row: int) -> None:
        self.ref_counts[row] = self.ref_counts.get(row, 0) + 1

    def _unref(self, row: int) -> None:
        self.ref_counts[row] -= 1
        if not self.ref_counts[row]:
            del self.ref_counts[row]
