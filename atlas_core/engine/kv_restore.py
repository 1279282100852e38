"""Reading a cached prefix back from the disk tier, or recomputing it: whichever is faster.

A slow disk can take longer to hand back a prompt's KV than the GPU takes to prefill it again
(a 32k-token prompt of an 8B model: 4.8 GB of KV, about 3 s at 1.6 GB/s, while a prefill of the
whole prompt took 3 s). :class:`DiskRestorePolicy` decides per prompt from two measured rates:

- the disk tier's read rate: bytes of completed reads over the seconds reads were in flight
  (:attr:`~atlas_core.engine.kv_disk.DiskTier.read_rate`, one observation per burst of reads);
- the prefill rate: tokens over seconds of the engine steps that prefill (:meth:`on_step`).

For the blocks of a prompt that only the disk holds, reading costs ``num_blocks * record_size /
read rate`` seconds and recomputing ``num_blocks * block_size / prefill rate``. The rate comes
from the steps actually run, so it averages whatever contexts they had; attention over a long
context makes the last tokens of a long prompt dearer than that, so the estimate leans towards
recomputing, which is never slower than a cold start. The choice is all or nothing per prompt:
the blocks in memory before the first disk-only one are always used, the disk-only run after it
is either read whole or recomputed whole (it cannot be split usefully: a recomputed block needs
every block before it). A read once started is waited for.

Before any prefill step is timed the disk is read (nothing to compare with: a server restarted
over a warm disk tier serves its prefixes at once); before any read is timed the disk is
assumed to read :data:`DEFAULT_DISK_BYTES_PER_S`. While prompts are recomputed the disk is still
sampled: the first :data:`PROBE_BLOCKS` skipped blocks are read in the background (not waited
for), which keeps the read rate current and stages those blocks for the next such prompt.
"""

from __future__ import annotations

from typing import Any

MODES = ("auto", "always", "never")
#: Disk read rate assumed until a read was timed (bytes/s): below what an NVMe drive reaches
#: through the tier, so an unmeasured disk is not preferred over a measured GPU.
DEFAULT_DISK_BYTES_PER_S = 1.0e9
#: Skipped disk blocks read in the background per recomputed prompt, to keep measuring.
PROBE_BLOCKS = 8
#: Weight each earlier observation keeps when a new one comes (disk: per burst of reads).
DISK_DECAY = 0.5
PREFILL_DECAY = 0.9


class RateEstimate:
    """Amount per second over recent observations: decayed sums of amounts and of seconds,
    so a larger observation weighs more than a small one.

    Args:
        decay: factor applied to the earlier sums at each observation (0: last one only).
    """

    def __init__(self, decay: float) -> None:
        self.decay = decay
        self.amount = self.seconds = 0.0

    def observe(self, amount: float, seconds: float) -> None:
        if amount <= 0 or seconds <= 0:
            return
        self.amount = self.amount * self.decay + amount
        self.seconds = self.seconds * self.decay + seconds

    @property
    def rate(self) -> float | None:
        """Amount per second, ``None`` before any observation."""
        return self.amount / self.seconds if self.seconds else None


class DiskRestorePolicy:
    """Whether a prompt's disk-only blocks are read back or recomputed (``--kv-disk-restore``).

    Args:
        mode: ``auto`` (the faster by the measured rates), ``always`` (read) or ``never``
            (recompute; nothing is read from disk for prompts).
        block_size: tokens per block.
        probe_blocks: skipped blocks read in the background per recomputed prompt (``auto``).
    """

    def __init__(self, mode: str, block_size: int, probe_blocks: int = PROBE_BLOCKS) -> None:
        if mode not in MODES:
            raise ValueError(f"--kv-disk-restore must be one of {', '.join(MODES)}, got {mode!r}")
        self.mode, self.block_size = mode, block_size
        self.probe_blocks = probe_blocks if mode == "auto" else 0
        self.prefill_rate = RateEstimate(PREFILL_DECAY)
        #: ``(num_blocks, read seconds, recompute seconds or None, read)`` of the last choice
        self.last_choice: tuple[int, float, float | None, bool] | None = None

    def on_step(self, sched: Any, seconds: float) -> None:
        """Time a completed step (a :class:`~atlas_core.engine.scheduler.SchedulerOutput`
        executed in ``seconds``); steps that prefill feed the prefill rate."""
        if sched.scheduled and not sched.is_decode_only:
            self.prefill_rate.observe(sched.num_tokens, seconds)

    def estimate(self, num_blocks: int, record_size: int,
                 disk_rate: float | None) -> tuple[float, float | None]:
        """``(read seconds, recompute seconds)`` of ``num_blocks`` disk-only blocks
        (recompute ``None`` before any prefill step was timed)."""
        read_s = num_blocks * record_size / (disk_rate or DEFAULT_DISK_BYTES_PER_S)
        tokens_per_s = self.prefill_rate.rate
        recompute_s = num_blocks * self.block_size / tokens_per_s if tokens_per_s else None
        return read_s, recompute_s

    def should_read(self, num_blocks: int, record_size: int, disk_rate: float | None) -> bool:
        """Whether to read ``num_blocks`` disk-only blocks rather than recompute them."""
        read_s, recompute_s = self.estimate(num_blocks, record_size, disk_rate)
        if self.mode == "auto":
            read = recompute_s is None or read_s <= recompute_s
        else:
            read = self.mode == "always"
        self.last_choice = (num_blocks, read_s, recompute_s, read)
        return read
