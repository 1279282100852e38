"""Tensor and expert parallelism: one worker process per GPU, applied to a built model as a
transform (model code stays unaware), driven by the engine in the front process.

See docs/multi-gpu.md. The pieces: :mod:`.config` (sizes, ranks, the launcher's rank
environment), :mod:`.store` (the rendezvous), :mod:`.cpu_comm` (a CommBackend over sockets),
:mod:`.sharding`, :mod:`.cuts` and :mod:`.layer_rules` (what each rank holds, quantized
weights included), :mod:`.transform` and :mod:`.parallel_ops` (where it communicates),
:mod:`.step` (the step description), :mod:`.worker` and :mod:`.executor`.
"""

from atlas_core.parallel.config import ParallelConfig

__all__ = ["ParallelConfig"]
