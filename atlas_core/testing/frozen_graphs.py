"""A numpy backend whose graphs replay like CUDA graphs: frozen ops, nothing kept alive.

The numpy and mock backends replay a "graph" by calling the captured function again, so every
Python decision is taken afresh and every array the function reaches stays alive through its
closure. A CUDA graph is neither: it replays the kernels recorded at capture, on the raw
addresses they were given, and holds no reference to the arrays behind them. Two kinds of bug
pass on CPU and corrupt replays on a GPU:

* an array the graph reads that nothing outside the captured function keeps alive (issue #27:
  a verify graph's index arrays, referenced only by the step's metadata, freed after capture
  and their memory reused: NaN logits on cuda, right tokens on numpy);
* a captured value computed on the host, or a host upload inside the capture (a CUDA graph
  would copy whatever the staging slot holds at replay time).

:class:`FrozenGraphBackend` records each top-level op call of the capture with its arguments
(op outputs of the capture are the graph's own buffers, held; every other array is held by a
weak reference to the allocation it views) and replays exactly those calls, writing into the
recorded outputs. An argument whose allocation was released raises
:class:`GraphReadsFreedArray` at replay; host transfers and syncs inside a capture raise too.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

import numpy as np

from atlas_core.backends.numpy_backend import NumpyBackend
from atlas_core.interfaces import Graph
from atlas_core.ops.registry import OpTable


class GraphReadsFreedArray(RuntimeError):
    """A replayed graph node reads an array released after capture (a use after free on a
    GPU)."""


def _root(a: np.ndarray) -> np.ndarray:
    """The array owning ``a``'s memory (the allocation a device array would view)."""
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def _address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


class _Weak:
    """An argument viewing an allocation the graph does not own: a weak reference to that
    allocation and the view's layout, rebuilt at each replay."""

    def __init__(self, a: np.ndarray, root: np.ndarray, what: str) -> None:
        self.ref = weakref.ref(root)
        self.same = a is root
        self.offset = _address(a) - _address(root)
        self.shape, self.strides, self.dtype = a.shape, a.strides, a.dtype
        self.what = what

    def get(self) -> np.ndarray:
        root = self.ref()
        if root is None:
            raise GraphReadsFreedArray(
                f"graph node {self.what}: an argument {list(self.shape)} {self.dtype} viewed an "
                "array released after capture; keep every array a captured step reads alive "
                "as long as its graph (a CUDA graph holds addresses, not arrays)")
        if self.same:
            return root
        return np.ndarray(self.shape, self.dtype, buffer=root, offset=self.offset,
                          strides=self.strides)


class _Recording:
    """The nodes of one capture and the allocations they own (op outputs)."""

    def __init__(self) -> None:
        self.nodes: list[tuple] = []
        self.owned: dict[int, np.ndarray] = {}

    def freeze(self, value: Any, what: str) -> Any:
        if isinstance(value, np.ndarray):
            root = _root(value)
            return value if id(root) in self.owned else _Weak(value, root, what)
        if isinstance(value, (list, tuple)):
            return type(value)(self.freeze(v, what) for v in value)
        if isinstance(value, dict):
            return {k: self.freeze(v, what) for k, v in value.items()}
        return value

    def own(self, value: Any, external: set[int]) -> None:
        """Take op outputs as graph buffers (not views of the op's inputs)."""
        if isinstance(value, np.ndarray):
            root = _root(value)
            if id(root) not in external:
                self.owned[id(root)] = root
        elif isinstance(value, (list, tuple)):
            for v in value:
                self.own(v, external)


def _thaw(value: Any) -> Any:
    if isinstance(value, _Weak):
        return value.get()
    if isinstance(value, (list, tuple)):
        return type(value)(_thaw(v) for v in value)
    if isinstance(value, dict):
        return {k: _thaw(v) for k, v in value.items()}
    return value


def _roots(value: Any, out: set[int]) -> set[int]:
    if isinstance(value, np.ndarray):
        out.add(id(_root(value)))
    elif isinstance(value, (list, tuple)):
        for v in value:
            _roots(v, out)
    elif isinstance(value, dict):
        for v in value.values():
            _roots(v, out)
    return out


def _store(backend: NumpyBackend, recorded: Any, new: Any) -> None:
    """Write a replayed op's outputs into the buffers the capture's later nodes read (and drop
    float32 copies the numpy ops cached of those buffers' old contents)."""
    if isinstance(recorded, (_Weak, np.ndarray)):
        target = _thaw(recorded)
        if isinstance(new, np.ndarray) and _address(target) != _address(new):
            np.copyto(target, new.reshape(target.shape))
            backend._invalidate(target)
    elif isinstance(recorded, (list, tuple)) and isinstance(new, (list, tuple)):
        for r, n in zip(recorded, new):
            _store(backend, r, n)


class FrozenGraph(Graph):
    """Replays the recorded op calls on their recorded buffers; holds no captured function."""

    def __init__(self, backend: "FrozenGraphBackend", nodes: list[tuple]) -> None:
        self.backend, self.nodes = backend, nodes

    def replay(self) -> None:
        for name, fn, args, kwargs, result in self.nodes:
            if name == "copy_":
                NumpyBackend.copy_(self.backend, *_thaw(args))
                continue
            _store(self.backend, result, fn(*_thaw(args), **_thaw(kwargs)))


class FrozenGraphBackend(NumpyBackend):
    """The numpy backend with :class:`FrozenGraph` graphs (see the module docstring).

    :meth:`capture` runs the function once eagerly (as cuda does, to load kernels and size the
    graph's workspace), then records it: ops that write their arguments run on copies and
    ``copy_`` is recorded, not done (a stream capture executes nothing).
    """

    name = "numpy-frozen-graphs"

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._recording: _Recording | None = None
        self._depth = 0
        inner, table = self.ops, OpTable("numpy-frozen-graphs")
        for name in inner:
            writes = self.op_registry.spec(name).writes_args
            setattr(table, name, self._wrap(name, getattr(inner, name), writes))
        self.ops = table

    def _wrap(self, name: str, fn: Callable, writes_args: bool) -> Callable:
        def op(*args: Any, **kwargs: Any) -> Any:
            rec = self._recording
            call_args, call_kwargs = args, kwargs
            if rec is not None and not self._depth and writes_args:
                call_args = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
                call_kwargs = {k: v.copy() if isinstance(v, np.ndarray) else v
                               for k, v in kwargs.items()}
            self._depth += 1
            try:
                result = fn(*call_args, **call_kwargs)
            finally:
                self._depth -= 1
            if rec is not None and not self._depth:
                # Nested calls (an op composed of others) replay inside their caller.
                node = (name, fn, rec.freeze(tuple(args), name), rec.freeze(kwargs, name))
                rec.own(result, _roots((args, kwargs), set()))
                rec.nodes.append((*node, rec.freeze(result, name)))
            return result
        return op

    def _refuse(self, what: str) -> None:
        if self._recording is not None:
            raise RuntimeError(f"{what} inside a graph capture: a CUDA graph would replay a copy "
                               "of whatever the host staging memory holds then, or cannot wait "
                               "for the device; do it before capturing")

    @property
    def supports_graphs(self) -> bool:
        return True

    def capture(self, fn: Callable[[], Any]) -> FrozenGraph:
        fn()
        rec = self._recording = _Recording()
        try:
            fn()
        finally:
            self._recording = None
        return FrozenGraph(self, rec.nodes)

    def copy_(self, dst: np.ndarray, src: np.ndarray) -> None:
        rec = self._recording
        if rec is None:
            return super().copy_(dst, src)
        if dst.shape != src.shape or dst.dtype != src.dtype:
            raise ValueError(f"copy_: destination {dst.shape} {dst.dtype} and source "
                             f"{src.shape} {src.dtype} must have the same shape and dtype")
        rec.nodes.append(("copy_", None, (rec.freeze(dst, "copy_"), rec.freeze(src, "copy_")),
                          {}, None))

    def from_host(self, array: np.ndarray) -> np.ndarray:
        self._refuse("from_host()")
        return super().from_host(array)

    def copy_from_host(self, dst: np.ndarray, src: np.ndarray) -> None:
        self._refuse("copy_from_host()")
        super().copy_from_host(dst, src)

    def to_host(self, array: np.ndarray) -> np.ndarray:
        self._refuse("to_host()")
        return super().to_host(array)

    def copy_to_host_async(self, dst: np.ndarray, src: np.ndarray) -> None:
        self._refuse("copy_to_host_async()")
        super().copy_to_host_async(dst, src)

    def synchronize(self) -> None:
        self._refuse("synchronize()")
