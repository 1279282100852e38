"""CUDA graph capture of :class:`~atlas_cuda.backend.CudaBackend`: a probe run sizes a private
workspace, stream capture records the work into it, and :class:`CudaGraph` replays it."""

from __future__ import annotations

from typing import Any, Callable

from atlas_core.api import Graph
from atlas_cuda.driver import check, drv
from atlas_cuda.memory import Workspace

#: Smallest private workspace of a captured graph (a probe run that used less still gets this).
ALIGN_MIN = 1 << 20


class CudaGraph(Graph):
    """An instantiated CUDA graph; ``output`` is what the captured function returned."""

    def __init__(self, exec_graph: Any, graph: Any, stream: Any, workspace: Workspace,
                 output: Any) -> None:
        self.exec_graph, self.graph, self.stream = exec_graph, graph, stream
        self.workspace = workspace
        self.output = output

    def replay(self) -> None:
        check(drv().cuGraphLaunch(self.exec_graph, self.stream))

    def __del__(self) -> None:
        try:
            drv().cuGraphExecDestroy(self.exec_graph)
            drv().cuGraphDestroy(self.graph)
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


class GraphCapture:
    """The graph methods of :class:`~atlas_cuda.backend.CudaBackend` (a mixin ahead of
    ``GpuBackend`` in its bases). Uses the backend's ``stream``, ``workspace``, ``synchronize``
    and the ``_capturing`` / ``_probing`` flags that ops and copies check."""

    @property
    def capturing(self) -> bool:
        """Whether a CUDA graph is being captured on this backend's stream (ops then take no
        path that syncs with the host or allocates)."""
        return self._capturing

    @property
    def probing(self) -> bool:
        """Whether :meth:`capture` is running its function's eager first call (the plans made
        then are what the graph replays: policy ``gemm_tune`` times cuBLASLt candidates only
        here, never in a served eager step)."""
        return self._probing

    @property
    def supports_graphs(self) -> bool:
        return True

    def capture(self, fn: Callable[[], Any]) -> CudaGraph:
        """Record ``fn``'s device work as a CUDA graph with its own workspace.

        ``fn`` runs once eagerly first (it compiles and loads its kernels and sizes the graph's
        private workspace), then once under stream capture. The returned graph's ``output`` is
        the captured call's return value; its arrays are rewritten by every replay.
        """
        main = self.workspace
        probe = Workspace(main.chunk.nbytes)
        self.workspace = probe
        try:
            self._probing = True
            try:
                fn()
            finally:
                self._probing = False
            self.synchronize()
            graph_ws = Workspace(max(probe.peak, ALIGN_MIN), growable=False)
            self.workspace = graph_ws
            mode = drv().CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
            check(drv().cuStreamBeginCapture(self.stream, mode))
            self._capturing = True
            try:
                output = fn()
            finally:
                self._capturing = False
                graph = check(drv().cuStreamEndCapture(self.stream))
            exec_graph = check(drv().cuGraphInstantiate(graph, 0))
        finally:
            self.workspace = main
        return CudaGraph(exec_graph, graph, self.stream, graph_ws, output)
