"""The engine side of a parallel run: start the workers, agree on the KV cache, and stand in
for the :class:`ModelRunner` — every step is described once and sent to every worker; rank 0
answers with the sampled tokens.

A worker that dies (its process ends, its connection drops, it reports an error, or a step
outlasts the timeout) makes every later step raise :class:`WorkerLostError`, which the engine
treats as fatal: running requests fail, ``/health`` turns 503 and ``atlas serve`` exits
non-zero; the executor stops every worker it started so no GPU process is left behind.
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing
import select
import socket
import threading
import time
from dataclasses import replace
from types import SimpleNamespace
from typing import Any, Callable

from atlas_core.engine.model_runner import StepResult
from atlas_core.parallel.config import ParallelConfig
from atlas_core.parallel.front import BusiestRankBytes, FrontBackend, FrontModel, RemoteStep
from atlas_core.parallel.host_clock import HostClock
from atlas_core.parallel.step import describe_step
from atlas_core.parallel.store import Channel, PeerLostError, StoreServer
from atlas_core.parallel.worker import WorkerSpec, worker_main

log = logging.getLogger(__name__)

#: Seconds a stopping worker gets before it is killed.
STOP_GRACE_S = 5.0
#: Step results before the run counts as warm, and the least wait for each of those first
#: results (kernel compiles and graph captures, not a hang; see ``_receive``).
WARM_STEPS, COLD_STEP_S = 16, 600.0


class WorkerLostError(RuntimeError):
    """A worker of the parallel run failed; the engine cannot go on."""

    fatal = True


def spawn_workers(parallel: ParallelConfig, args: Any, store_addr: tuple[str, int]) -> list:
    """Start this machine's workers as spawned processes (or, with the ray executor, every
    rank as a Ray task); returns them."""
    if parallel.executor == "ray":
        from atlas_core.parallel.ray_executor import spawn_ray_workers
        return spawn_ray_workers([WorkerSpec(rank, 0, args, parallel, store_addr)
                                  for rank in range(parallel.world_size)])
    ctx = multiprocessing.get_context("spawn")
    procs = []
    for rank, device in parallel.local_ranks():
        spec = WorkerSpec(rank, device, args, parallel, store_addr)
        proc = ctx.Process(target=worker_main, args=(spec,), name=f"atlas-worker-{rank}")
        proc.start()
        procs.append(proc)
    return procs


def stop_processes(procs: list, grace: float = STOP_GRACE_S) -> None:
    """Wait up to ``grace`` seconds for ``procs`` to end, then terminate, then kill them."""
    deadline = time.monotonic() + grace
    for proc in procs:
        proc.join(max(0.0, deadline - time.monotonic()))
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
            proc.join(2.0)
        if proc.is_alive():
            proc.kill()
            proc.join(2.0)


class ParallelExecutor:
    """Runs the model over ``parallel.world_size`` workers.

    Args:
        args: the engine's :class:`~atlas_core.engine.args.EngineArgs`.
        parallel: sizes and placement.

    Attributes:
        kv_config: the KV pool every worker allocated (the smallest any rank could hold).
        model: a :class:`FrontModel`; backend: a :class:`FrontBackend`.
        step_bytes: a :class:`BusiestRankBytes`, what a decode step reads on the rank that
            reads the most (the engine's decode timer and ``atlas bench`` count it).
    """

    def __init__(self, args: Any, parallel: ParallelConfig) -> None:
        self.parallel, self.timeout = parallel, parallel.timeout_s
        self._results_seen = 0
        self.sampler = SimpleNamespace(encode=None)
        self.error: str | None = None
        self._on_failure: Callable[[BaseException], None] | None = None
        self._closing = False
        self.clock = HostClock("engine")
        self._lock, self._io = threading.Lock(), threading.Lock()
        self._next_id = self._flushed = 0
        self._results: dict[int, list] = {}
        local = (parallel.nnodes == 1 and parallel.launched_rank is None
                 and parallel.executor == "mp")
        bind = "127.0.0.1" if local else "0.0.0.0"
        self._store = StoreServer(bind, parallel.master_port)
        self._listener = socket.create_server((bind, 0))
        advertise = "127.0.0.1" if local else parallel.master_addr
        if parallel.executor == "ray" and parallel.master_addr == "127.0.0.1":
            from atlas_core.parallel.ray_executor import node_address
            advertise = node_address()
        self._store.put("engine_addr", (advertise, self._listener.getsockname()[1]))
        self._procs = spawn_workers(parallel, args, (advertise, self._store.port))
        atexit.register(self.shutdown)
        try:
            self._chans = self._accept_workers()
            self._start()
        except BaseException:
            self.shutdown()
            raise
        threading.Thread(target=self._monitor, name="atlas-worker-monitor", daemon=True).start()

    def _accept_workers(self) -> dict[int, Channel]:
        chans: dict[int, Channel] = {}
        self._ready: dict[int, tuple] = {}
        pending: list[Channel] = []
        deadline = time.monotonic() + self.timeout
        while len(self._ready) < self.parallel.world_size:
            self._check_starting(deadline)
            readable, _, _ = select.select([self._listener, *pending], [], [], 0.2)
            for item in readable:
                if item is self._listener:
                    sock, _ = self._listener.accept()
                    pending.append(Channel(sock, "a worker"))
                    continue
                pending.remove(item)
                message = item.recv(self.timeout)
                if message[0] == "error":
                    raise WorkerLostError(f"worker failed to start: {message[2]}")
                _, rank, kv, info = message
                item.peer = f"worker {rank}"
                chans[rank], self._ready[rank] = item, (kv, info)
        return chans

    def _check_starting(self, deadline: float) -> None:
        for rank in range(self.parallel.world_size):
            error = self._store.peek(f"error/{rank}")
            if error:
                raise WorkerLostError(f"worker failed to start: {error}")
        for proc in self._procs:
            if proc.exitcode not in (None, 0):
                raise WorkerLostError(f"{proc.name} exited with status {proc.exitcode} while "
                                      "starting (its log above says why)")
        if time.monotonic() > deadline:
            missing = sorted(set(range(self.parallel.world_size)) - set(self._ready))
            raise WorkerLostError(f"workers {missing} did not start within {self.timeout:.0f} s "
                                  "(on other nodes: were they started with the same "
                                  "--master-addr / --master-port?)")

    def _start(self) -> None:
        kvs = [self._ready[r][0] for r in sorted(self._ready)]
        smallest = min(kvs, key=lambda kv: kv.num_blocks)
        self.kv_config = replace(smallest, max_seq_len=min(kv.max_seq_len for kv in kvs))
        for chan in self._chans.values():
            chan.send(("start", self.kv_config))
        info = self._ready[0][1]
        self.step_bytes = BusiestRankBytes([self._ready[r][1]["step_bytes"]
                                            for r in sorted(self._ready)])
        self.model = FrontModel(info["model"])
        self.backend = FrontBackend(info["backend"], self.parallel.world_size, info["device"],
                                    info["supports_graphs"], self.probe_bandwidth)
        log.info("%d workers ready on %s (%s): KV cache %d blocks per rank",
                 self.parallel.world_size, info["device"].name, info["backend"],
                 self.kv_config.num_blocks)

    def set_failure_handler(self, handler: Callable[[BaseException], None]) -> None:
        """Call ``handler(error)`` once when a worker is lost (the async engine's ``fail``),
        so a server stops even when no step is running."""
        self._on_failure = handler

    def _monitor(self) -> None:
        # Local processes by their exit status; every worker (other machines too) by what its
        # connection says while no step is waiting on it (an error report, or EOF).
        while not self._closing and self.error is None:
            for proc in self._procs:
                if proc.exitcode is not None and not self._closing:
                    self._lost(f"{proc.name} exited with status {proc.exitcode}")
                    return
            if self._io.acquire(blocking=False):
                try:
                    readable, _, _ = select.select(list(self._chans.values()), [], [], 0)
                    for chan in readable:
                        self._take(chan)
                except PeerLostError as exc:
                    if not self._closing:
                        self._lost(str(exc))
                finally:
                    self._io.release()
            time.sleep(0.2)

    def _lost(self, reason: str) -> None:
        with self._lock:
            first, self.error = self.error is None, self.error or reason
        if not first:
            return
        log.error("parallel run failed: %s; stopping every worker", reason)
        threading.Thread(target=self.shutdown, args=(0.5,), daemon=True).start()
        if self._on_failure is not None:
            self._on_failure(WorkerLostError(reason))

    @property
    def kv(self) -> Any:
        """The KV pool every worker allocated (``ModelRunner.kv``)."""
        return self.kv_config

    def copy_state_rows(self, copies: list[tuple[int, int]]) -> None:
        """Copy recurrent-state rows ``src -> dst`` on every worker (a speculative step's
        rollback after a rejection; each rank copies its own heads' rows) before the next
        step; nothing to wait for."""
        if copies:
            self._send("copy", list(copies))

    def mtp_proposer(self, block_manager: Any, max_drafts: int) -> Any:
        """The front's MTP proposer: the head runs on the workers
        (:class:`~atlas_core.parallel.spec.RemoteMTPProposer`)."""
        from atlas_core.parallel.spec import RemoteMTPProposer
        return RemoteMTPProposer(self, block_manager, max_drafts)

    def observe(self, work: list) -> dict:
        """Run the MTP head on every worker over ``work`` (see :mod:`atlas_core.parallel.spec`);
        rank 0's drafts, ``seq_id -> (length, drafts)``."""
        return self.result(self._send("observe", work))

    def probe_bandwidth(self, nbytes: int) -> tuple[float | None, str]:
        """``(GB/s, how)`` of a copy of ``nbytes`` timed on rank 0's device (``None`` and why,
        when it could not run there): the bandwidth of the floor under ``-tp``."""
        return tuple(self.result(self._send("probe", int(nbytes))))

    def execute(self, sched: Any, rows_of: dict) -> list[StepResult]:
        """Run one step on every worker; rank 0's sampled tokens (as ``ModelRunner.execute``)."""
        rows = [r for s in sched.scheduled for r in rows_of.get(s.seq.seq_id, [])]
        step_id = self._send("step", describe_step(sched, rows_of))
        return [StepResult(row, int(token), logprob)
                for row, (token, logprob) in zip(rows, self.result(step_id))]

    def launch_decode(self, sched: Any, rows: list, prev: Any = None) -> "RemoteStep":
        """Queue a decode step on every worker without waiting (``ModelRunner.launch_decode``:
        with ``prev`` the workers take its input ids from ``prev``'s sampled tokens on the
        device)."""
        rows_of = {s.seq.seq_id: [r] for s, r in zip(sched.scheduled, rows)}
        self.clock.tick("interval between decode launches")
        step_id = self._send("launch", describe_step(sched, rows_of), prev is not None)
        return RemoteStep(self, sched, rows, step_id)

    def _send(self, kind: str, *payload: Any) -> int:
        if self.error is not None:
            raise WorkerLostError(self.error)
        self._next_id += 1
        message = (kind, self._next_id, *payload)
        try:
            with self.clock(f"sending {kind}"):
                for chan in self._chans.values():
                    chan.send(message)
        except PeerLostError as exc:
            self._lost(str(exc))
            raise WorkerLostError(self.error) from None
        return self._next_id

    def result(self, step_id: int) -> list:
        """Rank 0's ``[(token_id, logprob)]`` of step ``step_id`` (asking the workers to report
        steps still in flight)."""
        try:
            with self._io:
                if step_id not in self._results and step_id > self._flushed:
                    self._flushed = self._next_id
                    self._chans[0].send(("flush",))
                while step_id not in self._results:
                    with self.clock("waiting for results"):
                        self._receive()
        except PeerLostError as exc:
            self._lost(str(exc))
            raise WorkerLostError(self.error) from None
        return self._results.pop(step_id)

    def _receive(self) -> None:
        # The first steps on a fresh machine compile kernels and capture graphs on every rank
        # (a minute or more): a hang is told from that only once the run is warm. A worker that
        # dies is seen at once either way (its connection closes).
        timeout = self.timeout if self._results_seen >= WARM_STEPS else max(self.timeout,
                                                                             COLD_STEP_S)
        deadline = time.monotonic() + timeout
        chans = list(self._chans.values())
        while True:
            wait = deadline - time.monotonic()
            if wait <= 0:
                raise PeerLostError(f"no step result within {timeout:.0f} s")
            readable, _, _ = select.select(chans, [], [], min(wait, 0.5))
            if self.error is not None:
                raise PeerLostError(self.error)
            if readable:
                self._take(readable[0])
                return

    def _take(self, chan: Channel) -> None:
        """Read one message of a readable worker connection: keep a result, raise on the rest."""
        message = chan.recv(self.timeout)
        if message[0] == "error":
            raise PeerLostError(message[2])
        if message[0] != "result" or chan is not self._chans[0]:
            raise PeerLostError(f"{chan.peer} sent {message[0]!r} out of turn")
        self._results[message[1]] = message[2]
        self._results_seen += 1

    def shutdown(self, grace: float = STOP_GRACE_S) -> None:
        """Stop every worker this process started (idempotent)."""
        if self._closing:
            return
        self._closing = True
        self.clock.report()
        for chan in getattr(self, "_chans", {}).values():
            try:
                chan.send(("shutdown",))
            except PeerLostError:
                pass
        stop_processes(self._procs, grace)
        self._store.close()
        self._listener.close()
