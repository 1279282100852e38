"""Parameters declared by model modules, and where each comes from in an HF checkpoint.

A :class:`Module` declares its parameters with shapes and their *sources*: the HF checkpoint
tensors whose data, concatenated in order along the flattened parameter, fill it. Packing is
thus just declaration (``qkv_proj.weight`` <- ``q_proj.weight``, ``k_proj.weight``,
``v_proj.weight``), and one generic loader (:mod:`atlas_core.model.weight_loading`) fills any
model. A parameter may list alternative source sets (e.g. per-expert tensors or a fused one).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import numpy as np


@dataclass(frozen=True)
class Source:
    """One checkpoint tensor (name relative to the module) that fills part of a parameter."""

    name: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class ParamSpec:
    """A parameter's shape, storage dtype (None: the model dtype) and source alternatives.

    ``quantizable``: the loader may keep it as a
    :class:`~atlas_core.ops.quant.QuantizedWeight` when its checkpoint tensors are quantized
    (only weights that the module passes whole to weight-taking ops; a module that slices or
    rewrites a parameter on the host declares it ``quantizable=False`` and gets it dequantized).
    """

    shape: tuple[int, ...]
    sources: tuple[tuple[Source, ...], ...]
    dtype: Any = None
    quantizable: bool = True


class Module:
    """A node of the model tree: declared parameters, their device arrays, named children.

    Names mirror the HF checkpoint: a child registered as ``"self_attn"`` under a module at
    ``"model.layers.0"`` has its parameter ``"o_proj.weight"`` filled from
    ``"model.layers.0.self_attn.o_proj.weight"``.
    """

    def __init__(self) -> None:
        self.specs: dict[str, ParamSpec] = {}
        self.params: dict[str, Any] = {}
        self.children: dict[str, Module] = {}
        self.backend: Any = None
        self.ops: Any = None
        self.dtype: np.dtype | None = None

    def declare(self, name: str, shape: Sequence[int], sources: Sequence[Any] | None = None,
                dtype: Any = None, quantizable: bool = True) -> None:
        """Declare parameter ``name``.

        Args:
            name: parameter name relative to this module, e.g. ``"qkv_proj.weight"``.
            shape: its shape.
            sources: ``None`` (one checkpoint tensor of the same name and shape), a list of
                ``(name, shape)`` pairs packed in order, or a list of such lists (alternatives).
            dtype: storage dtype; default the model dtype.
            quantizable: see :class:`ParamSpec` (only weights of the model dtype are).
        """
        shape = tuple(int(d) for d in shape)
        if sources is None:
            sources = [(name, shape)]
        alternatives = sources if sources and isinstance(sources[0], list) else [sources]
        groups = []
        for group in alternatives:
            group = tuple(Source(n, tuple(int(d) for d in s)) for n, s in group)
            total = sum(math.prod(s.shape) for s in group)
            if total != math.prod(shape):
                raise ValueError(f"parameter {name!r} {list(shape)}: sources {group} hold {total} "
                                 "elements")
            groups.append(group)
        self.specs[name] = ParamSpec(shape, tuple(groups), dtype,
                                     quantizable and dtype is None and len(shape) >= 2)

    def add(self, name: str, child: "Module | None") -> Any:
        """Register ``child`` under ``name`` (no-op for ``None``) and return it."""
        if child is not None:
            self.children[name] = child
        return child

    def named_specs(self, prefix: str = "") -> Iterator[tuple[str, "Module", str, ParamSpec]]:
        """Yield ``(full_name, module, local_name, spec)`` for every parameter in the tree."""
        for local, spec in self.specs.items():
            yield prefix + local, self, local, spec
        for child_name, child in self.children.items():
            yield from child.named_specs(f"{prefix}{child_name}.")

    def materialize(self, backend: Any, dtype: Any,
                    allocate: Callable[["Module", str], Any] | None = None) -> None:
        """Allocate every parameter on ``backend`` (uninitialised) and run :meth:`setup`.

        Args:
            backend: the GpuBackend.
            dtype: the model dtype.
            allocate: optional ``allocate(module, local_name)`` returning the parameter's
                storage, or None for a plain ``backend.empty`` array (the loader passes one that
                allocates quantized weights).
        """
        self.backend, self.ops, self.dtype = backend, backend.ops, np.dtype(dtype)
        for local, spec in self.specs.items():
            array = allocate(self, local) if allocate is not None else None
            self.params[local] = (array if array is not None
                                  else backend.empty(spec.shape, spec.dtype or self.dtype))
        for child in self.children.values():
            child.materialize(backend, dtype, allocate)
        self.setup()

    def modules(self) -> Iterator["Module"]:
        """Yield this module and every module below it, parents before children."""
        yield self
        for child in self.children.values():
            yield from child.modules()

    def setup(self) -> None:
        """Optional. Build derived device state (e.g. rotary tables) once allocated."""

    def post_load(self) -> None:
        """Optional. Rework this module's parameters once every checkpoint tensor is in place.

        The generic loader (:func:`~atlas_core.model.weight_loading.load_weights`) calls it on
        every module of the tree, parents before children, exactly once per load: e.g. to
        reorder a fused projection from the checkpoint's head-interleaved layout into the
        layout the ops take. The default does nothing.
        """

    def param(self, name: str) -> Any:
        """Device array of parameter ``name``, or ``None`` when it was not declared."""
        return self.params.get(name)
