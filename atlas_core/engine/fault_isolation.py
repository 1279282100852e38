"""An engine's fault isolation: a request whose tokens cannot be handled fails alone, a step
that raises fails the requests it carried, and the engine goes on (LLMEngine's mixin)."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from atlas_core.engine.scheduler import SchedulerOutput
    from atlas_core.engine.sequence import Sequence, SequenceGroup

#: The engine's own logger: its failures are logged where its other messages are.
log = logging.getLogger("atlas_core.engine.llm_engine")


class FaultIsolation:
    """The failure paths of :class:`~atlas_core.engine.llm_engine.LLMEngine` (they use its
    scheduler, state cache, stop checker, thinking budgets, guided decoding and stats)."""

    def _drop_failed(self, sched: SchedulerOutput, slots: set[int]) -> None:
        sched.scheduled = [s for s in sched.scheduled if not s.seq.is_finished]
        if self.state_cache is not None:
            self.state_cache.cancel([c for c in sched.snapshots if c[0] in slots])
            sched.snapshots = [c for c in sched.snapshots if c[0] not in slots]

    def _fail_step(self, exc: Exception) -> None:
        seqs = [s.seq for sched in self._planned for s in sched.scheduled]
        if self._inflight is not None:
            seqs += [s.seq for s in self._inflight.sched.scheduled]
            self._inflight = None
        try:
            self.backend.synchronize()
        except Exception:  # noqa: BLE001 - the device may be what failed; nothing to wait for
            log.debug("synchronize after a failed step failed too", exc_info=True)
        if self.state_cache is not None:
            self.state_cache.cancel()
        if not seqs:
            seqs = [seq for group in self.groups.values() for seq in group.seqs]
        for group in {seq.group.request_id: seq.group for seq in seqs}.values():
            self._fail(group, exc)

    def _fail_seq(self, seq: Sequence, exc: Exception) -> None:
        log.error("request %s failed; the engine goes on", seq.request_id, exc_info=exc)
        self._fail(seq.group, exc)

    def _fail(self, group: SequenceGroup, exc: Exception) -> None:
        if self.groups.pop(group.request_id, None) is None:
            return
        for seq in group.seqs:
            if not seq.is_finished:
                self.scheduler.finish(seq)
                self.stop_checker.abort(seq)
                seq.finish_reason = "error"
            self.thinking.forget(seq)
            self.guided.forget(seq)
        group.pending = []
        group.metrics.finish_time = time.time()
        self._stats.num_failed_requests += 1
        out = group.output()
        out.error = f"{type(exc).__name__}: {exc}"
        self._failed.append(out)
