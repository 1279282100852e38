"""What the engine process holds of a parallel run in place of a model, a backend and a
pending decode step (the weights and the devices live in the workers)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from atlas_core.engine.model_runner import StepResult


class FrontModel:
    """What the engine reads of the model in the front process (the weights live in the
    workers), and the request-side ``mm_processor`` of a model that takes images (None
    otherwise): requests are processed here, every worker encodes their images itself."""

    def __init__(self, facts: dict[str, Any]) -> None:
        self.config, self.path = facts["config"], Path(facts["path"])
        self.vocab_size, self.hidden_size = facts["vocab_size"], facts["hidden_size"]
        self.num_layers, self.dtype = facts["num_layers"], facts["dtype"]
        self.max_position_embeddings = facts["max_position_embeddings"]
        self.tie_word_embeddings = facts["tie_word_embeddings"]
        self.mm_processor = facts.get("mm_processor")
        self.mtp, self.mtp_enabled = None, bool(facts.get("mtp_enabled"))

    def enable_mtp(self) -> bool:
        """Whether the workers loaded an MTP head and gave it a KV pool (they do both before
        planning their KV cache when the engine's speculative method is ``mtp``)."""
        return self.mtp_enabled


class FrontBackend:
    """The engine's view of the workers' backends: their name, device and whether they replay
    decode graphs (then the engine chains decode steps, :meth:`ParallelExecutor.launch_decode`);
    no device work happens here. ``probe_bandwidth(nbytes) -> (GB/s or None, how)`` times a copy
    on rank 0's device through its worker (the decode floor's bandwidth)."""

    def __init__(self, name: str, world_size: int, device: Any, supports_graphs: bool,
                 probe_bandwidth: Any) -> None:
        self.name = f"{name} x{world_size}"
        self.device, self.supports_graphs = device, supports_graphs
        self.probe_bandwidth = probe_bandwidth

    def device_info(self) -> Any:
        """Rank 0's :class:`~atlas_core.interfaces.DeviceInfo`."""
        return self.device

    def synchronize(self) -> None:
        """Nothing runs in the front process."""


class RemoteStep:
    """A decode step launched on the workers whose tokens the engine has not read yet (the
    engine's ``PendingStep``)."""

    def __init__(self, executor: Any, sched: Any, rows: list, step_id: int) -> None:
        self.executor, self.sched, self.rows, self.step_id = executor, sched, rows, step_id

    def results(self) -> list[StepResult]:
        """Wait for rank 0's sampled tokens of this step."""
        got = self.executor.result(self.step_id)
        return [StepResult(row, int(token), None) for row, (token, _) in zip(self.rows, got)]


class BusiestRankBytes:
    """Bytes one decode step reads on the rank that reads the most (its weight shard, its
    experts' share of the batch's picks, its KV heads): the ranks run in lockstep, so the
    step's floor is that rank's bytes over one GPU's bandwidth. Called like
    :class:`~atlas_core.engine.step_timing.StepBytes`, which each worker measured of its own
    shard and sent with its ``ready`` message."""

    def __init__(self, ranks: list[Any]) -> None:
        self.ranks = ranks
        self.world_size = len(ranks)

    def __call__(self, batch: int, context_tokens: int) -> int:
        """The largest rank's bytes of one step over ``batch`` sequences holding
        ``context_tokens`` tokens in all."""
        return max(rank(batch, context_tokens) for rank in self.ranks)
