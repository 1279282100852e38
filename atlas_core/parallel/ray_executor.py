"""Workers as Ray tasks (``--distributed-executor-backend ray``), for clusters already run by
Ray: one task per rank, each holding one GPU Ray assigns (Ray sets its
``CUDA_VISIBLE_DEVICES``). Ray is imported only here, and only when asked for."""

from __future__ import annotations

from typing import Any


class RayWorker:
    """A worker task with the process-like surface the executor watches (``name``,
    ``exitcode``, ``is_alive``, ``join``, ``terminate``, ``kill``)."""

    def __init__(self, ray: Any, ref: Any, name: str) -> None:
        self._ray, self._ref, self.name = ray, ref, name
        self._exitcode: int | None = None

    @property
    def exitcode(self) -> int | None:
        if self._exitcode is None:
            done, _ = self._ray.wait([self._ref], timeout=0)
            if done:
                try:
                    self._exitcode = int(self._ray.get(self._ref))
                except Exception:  # noqa: BLE001 - the task died: report it as a failure
                    self._exitcode = 1
        return self._exitcode

    def is_alive(self) -> bool:
        return self.exitcode is None

    def join(self, timeout: float | None = None) -> None:
        self._ray.wait([self._ref], timeout=timeout)

    def terminate(self) -> None:
        self._ray.cancel(self._ref, force=True)

    kill = terminate


def _run(spec: Any) -> int:
    from atlas_core.parallel.worker import run_worker, select_device
    select_device(0)
    return run_worker(spec)


def spawn_ray_workers(specs: list) -> list[RayWorker]:
    """Start one Ray task (one GPU) per :class:`~atlas_core.parallel.worker.WorkerSpec`."""
    import ray
    if not ray.is_initialized():
        ray.init(address="auto")
    task = ray.remote(num_gpus=1)(_run)
    return [RayWorker(ray, task.remote(spec), f"atlas-worker-{spec.rank}") for spec in specs]


def node_address() -> str:
    """This node's address as the Ray cluster reaches it."""
    import ray
    return ray.util.get_node_ip_address()
