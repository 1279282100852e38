"""A worker: one rank on one GPU. It loads its slices of the model, joins the communicator,
sizes its KV cache, then runs every step the engine sends with the single-GPU ModelRunner.

Protocol over its :class:`~atlas_core.parallel.store.Channel` to the engine: the worker sends
``("ready", rank, kv_config, info)``; the engine answers ``("start", kv_config)`` (the smallest
KV pool any rank can hold); then ``("step", id, StepDescription)`` -> rank 0 answers
``("result", id, [(token_id, logprob), ...])``; ``("launch", id, StepDescription, chained)``
queues a decode step (async scheduling) whose result follows the next launch or a
``("flush",)``; ``("copy", id, rows)`` and ``("observe", id, seqs)`` serve speculative
decoding (:mod:`atlas_core.parallel.spec`); ``("probe", id, nbytes)`` -> rank 0 answers
``("result", id, (GB/s or None, how))`` of a copy on its device; ``("shutdown",)`` ends it.
``info`` carries, besides the device and the model's facts, the ``StepBytes`` of this rank's
shard (the engine's floor counts the busiest rank). Any failure is sent as
``("error", rank, message)`` before the worker exits non-zero. A step that does not finish
within the timeout (a peer died inside a collective) aborts the communicator and exits.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from atlas_core import env
from atlas_core.parallel.config import ParallelConfig
from atlas_core.parallel.host_clock import HostClock
from atlas_core.parallel.store import Channel, PeerLostError, StoreClient

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerSpec:
    """What a worker process needs to start (picklable).

    Attributes:
        rank, device_index: its rank and the GPU index on its machine.
        args: the engine's :class:`~atlas_core.engine.args.EngineArgs`.
        parallel: the run's :class:`ParallelConfig`.
        store_addr: ``(host, port)`` of the rendezvous store.
    """

    rank: int
    device_index: int
    args: Any
    parallel: ParallelConfig
    store_addr: tuple[str, int]


def select_device(index: int) -> None:
    """Make GPU ``index`` of this machine the only one this process sees (before CUDA starts)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    devices = visible.split(",") if visible else None
    os.environ["CUDA_VISIBLE_DEVICES"] = devices[index] if devices else str(index)


def comm_backend_name(parallel: ParallelConfig, backend: Any) -> str:
    """The configured comm backend, else ``nccl`` for the cuda backend and ``cpu`` otherwise."""
    if parallel.comm_backend:
        return parallel.comm_backend
    return "nccl" if getattr(backend, "name", "") == "cuda" else "cpu"


def _create_backend(registry: Any, name: str | None) -> Any:
    from atlas_core.engine.loading import default_backend_name
    name = name or default_backend_name(registry)
    return registry.create("gpu_backends", name, **({"device_id": 0} if name == "cuda" else {}))


def load_rank(spec: WorkerSpec, store: StoreClient) -> tuple[Any, Any, Any, dict]:
    """``(backend, comm, model, config)`` of this rank: its backend, the communicator, its
    shard and the model's (whole) config.json."""
    from atlas_core.engine.loading import model_path_or_demo
    from atlas_core.model.loader import architecture, create_loader, quant_method, read_config
    from atlas_core.parallel.transform import load_shard
    from atlas_core.plugins import Registry
    from atlas_core.weights.checkpoint import Checkpoint
    from atlas_core.weights.resolve import resolve_model
    args, parallel = spec.args, spec.parallel
    registry = Registry()
    backend = _create_backend(registry, args.backend)
    comm = registry.create("comm_backends", comm_backend_name(parallel, backend), rank=spec.rank,
                           world_size=parallel.world_size, store=store, backend=backend,
                           timeout=parallel.timeout_s)
    path = resolve_model(model_path_or_demo(args.model), cache_dir=args.cache_dir,
                         revision=args.revision)
    config = read_config(path)
    loader = create_loader(registry, architecture(config))
    loader.validate_config(config)
    # as one GPU's loader does, for either way of loading: the quantization decides the
    # backend's kernels, and --dequantize-weights how quantized weights are kept
    if args.dequantize_weights:
        from atlas_core.model.quantized_loading import dequantize_all
        dequantize_all(backend)
    backend.bind_model(config.get("model_type"), quant_method(config))
    if args.load_format == "dummy":
        from atlas_core.parallel.transform import build_random_shard
        model = build_random_shard(loader, config, backend, comm,
                                   parallel.enable_expert_parallel, args.dtype, args.seed)
    else:
        model = load_shard(loader, config, Checkpoint.open(path), backend, comm,
                           parallel.enable_expert_parallel, args.dtype)
    model.path = path
    return backend, comm, model, config


def model_facts(model: Any, config: dict) -> dict[str, Any]:
    """What the engine process needs to know of the model (see ``FrontModel``)."""
    return {"config": config, "path": str(model.path), "vocab_size": model.vocab_size,
            "hidden_size": model.hidden_size, "num_layers": model.num_layers,
            "dtype": model.dtype, "max_position_embeddings": model.max_position_embeddings,
            "tie_word_embeddings": model.tie_word_embeddings,
            "mm_processor": getattr(model, "mm_processor", None),
            "mtp_enabled": bool(getattr(model, "mtp_enabled", False))}


def serve_steps(spec: WorkerSpec, chan: Channel, backend: Any, comm: Any, model: Any,
                config: dict) -> None:
    """Size the KV cache, agree on it with the engine, then run steps until shutdown."""
    from atlas_core.engine.kv_sizing import plan_kv_cache
    from atlas_core.engine.model_runner import ModelRunner
    from atlas_core.parallel.spec import WorkerSpeculation
    args = spec.args
    speculation = WorkerSpeculation(args.speculative_config, model)
    planned = plan_kv_cache(backend, model, args)
    chan.send(("ready", spec.rank, planned,
               {"device": backend.device_info(), "backend": getattr(backend, "name", "?"),
                "supports_graphs": bool(backend.supports_graphs),
                "model": model_facts(model, config),
                "step_bytes": rank_step_bytes(model, planned, spec.parallel)}))
    _, kv = chan.recv()
    runner = ModelRunner(model, backend, kv, args.max_batch_size, args.max_prefill_tokens,
                         kv.max_seq_len)
    if (Path(model.path) / "tokenizer.json").is_file():
        from atlas_core.tokenizer import Tokenizer
        runner.sampler.encode = Tokenizer.from_dir(model.path).encode  # DRY breaker strings
    speculation.bind(runner)
    steps = _Steps(spec.rank, chan, runner, speculation, backend)
    watchdog = _Watchdog(spec.rank, comm, spec.parallel.timeout_s,
                         getattr(backend, "compile_seconds", None))
    clock = steps.clock
    while True:
        with clock("waiting for the engine"):
            message = chan.recv()
        if message[0] == "shutdown":
            clock.report()
            return
        watchdog.arm()
        try:
            with clock(f"handling {message[0]}"):
                steps.handle(message)
        finally:
            watchdog.deadline = None


def rank_step_bytes(model: Any, kv: Any, parallel: ParallelConfig) -> Any:
    """What one decode step reads on this rank (:class:`~atlas_core.engine.step_timing.
    StepBytes` of its shard and KV heads; the KV pool's size does not enter it, so the plan's
    config serves before the engine settles on the smallest pool)."""
    from atlas_core.engine.step_timing import StepBytes
    nbytes = StepBytes(model, kv)
    if parallel.enable_expert_parallel:
        nbytes.expert_share = parallel.world_size
    return nbytes


def probe_bandwidth(backend: Any, nbytes: int) -> tuple[float | None, str]:
    """``(GB/s, how)`` of a device-to-device copy of ``nbytes`` on this rank's device (read +
    write counted), or ``(None, why not)``: the floor is information, a failed probe (no room
    left beside the KV cache) must not end the run."""
    from atlas_core.bench.floor import copy_bandwidth
    try:
        return copy_bandwidth(backend, nbytes), "measured copy, read + write"
    except Exception as exc:  # noqa: BLE001 - reported to the engine instead
        return None, f"the copy probe failed: {type(exc).__name__}: {exc}"


class _Watchdog:
    """Aborts the communicator and ends the process when a step outlasts ``timeout`` (a peer
    died inside a collective, where NCCL would wait forever). One thread for the worker's
    life: :meth:`arm` starts a step's clock, setting :attr:`deadline` to None stops it.

    ``busy``: the backend's seconds spent compiling kernels so far (``compile_seconds``), added
    to the deadline: the first steps on a fresh machine compile for a minute or more, the same
    kernels on every rank at about the same time, and that is not a hang."""

    def __init__(self, rank: int, comm: Any, timeout: float, busy: Any = None) -> None:
        self.rank, self.comm, self.timeout = rank, comm, timeout
        self.busy = busy or (lambda: 0.0)
        self.deadline: float | None = None
        self._busy_at_arm = 0.0
        threading.Thread(target=self._watch, name="atlas-step-watchdog", daemon=True).start()

    def arm(self) -> None:
        self._busy_at_arm = self.busy()
        self.deadline = time.monotonic() + self.timeout

    def _watch(self) -> None:
        while True:
            time.sleep(min(1.0, self.timeout / 4))
            deadline = self.deadline
            if deadline is not None:
                deadline += self.busy() - self._busy_at_arm
            if deadline is not None and time.monotonic() > deadline:
                log.error("rank %d: a step did not finish within %.0f s (a peer died inside a "
                          "collective?); aborting", self.rank, self.timeout)
                try:
                    self.comm.abort()
                finally:
                    os._exit(3)
                return


class _Steps:
    """Runs the engine's messages on a ModelRunner: ``step`` (run now, rank 0 reports),
    ``launch`` (queue a decode step, chained on the previous launch when asked, then report
    the one before it: its tokens are ready by then), ``flush`` (report what is queued), and
    for speculative decoding ``copy`` (recurrent-state rows, no answer) and ``observe`` (run
    the MTP head, rank 0 reports the drafts); see :mod:`atlas_core.parallel.spec`. ``probe``
    times a copy on rank 0's device (the bench's floor); the other ranks ignore it."""

    def __init__(self, rank: int, chan: Channel, runner: Any, speculation: Any,
                 backend: Any = None) -> None:
        self.rank, self.chan, self.runner, self.speculation = rank, chan, runner, speculation
        self.backend = backend
        self.queued: list[tuple[int, Any]] = []
        self.last: Any = None
        self.clock = HostClock(f"rank {rank}")

    def handle(self, message: tuple) -> None:
        kind = message[0]
        if kind == "flush":
            self.report(len(self.queued))
        elif kind == "step":
            self.report(len(self.queued))
            results = self.runner.execute(message[2].sched, message[2].rows_of)
            self.send(message[1], [(r.token_id, r.logprob) for r in results])
        elif kind == "launch":
            _, step_id, desc, chained = message
            self.clock.tick("interval between decode launches")
            rows = [desc.rows_of[s.seq.seq_id][0] for s in desc.sched.scheduled]
            with self.clock("of which launch_decode"):
                self.last = self.runner.launch_decode(desc.sched, rows,
                                                      self.last if chained else None)
            self.queued.append((step_id, self.last))
            self.report(len(self.queued) - 1)
        elif kind == "copy":
            self.runner.copy_state_rows(message[2])
        elif kind == "probe":
            self.report(len(self.queued))
            if self.rank == 0:
                self.send(message[1], probe_bandwidth(self.backend, message[2]))
        elif kind == "observe":
            self.report(len(self.queued))
            self.send(message[1], self.speculation.observe(message[2]))
        else:
            raise ValueError(f"unknown message {kind!r} from the engine")

    def report(self, count: int) -> None:
        for step_id, pending in self.queued[:count]:
            with self.clock("of which waiting for the device"):
                ids = pending.read.wait()
            self.send(step_id, [(int(t), None) for t in ids])
        del self.queued[:count]

    def send(self, step_id: int, results: list) -> None:
        if self.rank == 0:
            self.chan.send(("result", step_id, results))


def run_worker(spec: WorkerSpec) -> int:
    """A worker process's main: returns its exit status (0 after a clean shutdown)."""
    logging.basicConfig(level=env.log_level(),
                        format=f"[rank {spec.rank}] %(levelname)s %(name)s: %(message)s")
    timeout = spec.parallel.timeout_s
    chan = comm = store = None
    try:
        store = StoreClient(*spec.store_addr, timeout)
        backend, comm, model, config = load_rank(spec, store)
        chan = Channel.connect(*store.get("engine_addr"), timeout, peer="the engine")
        serve_steps(spec, chan, backend, comm, model, config)
        return 0
    except PeerLostError as exc:
        log.error("rank %d: lost the engine or a peer: %s", spec.rank, exc)
        return 1
    except BaseException as exc:  # noqa: BLE001 - reported to the engine, then exit non-zero
        message = f"rank {spec.rank}: {type(exc).__name__}: {exc}"
        log.error("%s\n%s", message, traceback.format_exc())
        if chan is None and store is not None:
            try:
                store.set(f"error/{spec.rank}", message)
            except Exception:  # noqa: BLE001 - the store may be gone too
                pass
        elif chan is not None:
            try:
                chan.send(("error", spec.rank, message))
            except PeerLostError:
                pass
        return 1
    finally:
        if comm is not None:
            comm.close()


def worker_main(spec: WorkerSpec) -> None:
    """Entry point of a spawned worker process."""
    if spec.args.backend in (None, "cuda"):
        select_device(spec.device_index)
    raise SystemExit(run_worker(spec))
