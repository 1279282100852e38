"""The op registry and the op tables built from it.

Every plugin (core included) registers op specs and per-backend implementations with the
``register_ops`` hook::

    register("rms_norm", OpSpec("rms_norm", "atlas_core.ops.norm:rms_norm"))
    register("rms_norm", "atlas_cuda.ops:DenseOps.rms_norm", backend="cuda")

A backend's ``ops`` table (:class:`OpTable`) holds, for each registered spec, the backend's own
implementation, else the spec's unfused definition over the same table, else (where the backend
allows it: numpy) the reference. An implementation ``"pkg.module:Class.method"`` is bound to one
instance of ``Class`` per table: ``Class(context)``, or the instance the backend's ``bind``
gives (the cuda backend shares one instance per class on its op context); any other
implementation is used as is. The table holds those bound methods and plain functions directly:
calling an op costs one attribute lookup and the call, no wrapper.
"""

from __future__ import annotations

import importlib
import logging
import types
from pathlib import Path
from typing import Any, Callable, Iterator

from atlas_core.ops.spec import OpSpec
from atlas_core.plugins import PluginError, Registry, resolve

log = logging.getLogger(__name__)

KIND = "ops"


class OpTable:
    """``backend.ops``: one attribute per op the backend has (``backend.ops.rms_norm(...)``).

    ``name in table`` tells whether the backend has an op; iterating yields the names it has.
    A missing op raises :class:`AttributeError` saying who registered it and how to add it.
    """

    def __init__(self, backend: str, missing: dict[str, str] | None = None) -> None:
        self._backend = backend
        self._missing = dict(missing or {})

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and not name.startswith("_") and name in self.__dict__

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(n for n in self.__dict__ if not n.startswith("_")))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if name in self._missing:
            raise AttributeError(
                f"op {name!r} (registered by plugin {self._missing[name]!r}) has no "
                f"{self._backend} implementation and no unfused definition; install the plugin "
                f"that implements it for {self._backend}, or register one with "
                f"register(name, impl, backend={self._backend!r}) in a register_ops hook")
        raise AttributeError(f"no op named {name!r} is registered; the {self._backend} backend "
                             f"has: {', '.join(self)}")


class OpRegistry:
    """The op specs, implementations and CUDA source folders the plugins of one
    :class:`~atlas_core.plugins.Registry` registered.

    >>> ops = OpRegistry.load()
    >>> table = ops.build_table("numpy", backend, use_reference=True)
    """

    def __init__(self, registry: Registry | None = None) -> None:
        self.registry = registry if registry is not None else Registry()
        self.specs: dict[str, OpSpec] = {}
        self.impls: dict[tuple[str, str], Any] = {}
        for key, (value, owner) in self.registry.entries[KIND].items():
            name, _, backend = key.partition("@")
            if backend:
                self.impls[(name, backend)] = value
            elif not isinstance(value, OpSpec):
                raise PluginError(f"plugin {owner!r} registered {value!r} as op {name!r}; "
                                  f"register an OpSpec, or pass backend=... for an implementation")
            elif value.name != name:
                raise PluginError(f"plugin {owner!r} registered OpSpec {value.name!r} under "
                                  f"the name {name!r}; use register(spec.name, spec)")
            else:
                self.specs[name] = value
        for name, backend in self.impls:
            if name not in self.specs:
                log.warning("plugin %r registered a %s implementation of op %r, which no plugin "
                            "declares; it is ignored", self.owner(name, backend), backend, name)

    @classmethod
    def load(cls) -> "OpRegistry":
        """The ops of a fresh plugin manager (built-ins and every allowed entry point)."""
        return cls(Registry())

    def names(self) -> list[str]:
        """Every registered op name, sorted."""
        return sorted(self.specs)

    def spec(self, name: str) -> OpSpec:
        """The spec of op ``name``.

        Raises:
            KeyError: no plugin registered it (the message lists what is).
        """
        try:
            return self.specs[name]
        except KeyError:
            raise KeyError(f"no op named {name!r}; registered: {', '.join(self.names())}") from None

    def owner(self, name: str, backend: str | None = None) -> str:
        """The plugin that registered op ``name`` (or its implementation on ``backend``)."""
        return self.registry.owner(KIND, name if backend is None else f"{name}@{backend}")

    def reference(self, name: str) -> Callable[..., Any]:
        """The resolved NumPy reference of op ``name``."""
        return resolve(self.spec(name).reference)

    def backends(self, name: str) -> list[str]:
        """Backends with their own implementation of op ``name``."""
        return sorted(b for n, b in self.impls if n == name)

    def kernel_source_dirs(self) -> list[Path]:
        """CUDA source folders registered with ``register_kernel_sources``, by name."""
        dirs = []
        for name in self.registry.names("kernel_sources"):
            value = self.registry.get("kernel_sources", name)
            dirs.append(Path(value() if callable(value) else value))
        return dirs

    def build_table(self, backend: str, context: Any = None, *,
                    bind: Callable[[type], Any] | None = None,
                    use_reference: bool = False) -> OpTable:
        """The op table of one backend instance.

        Args:
            backend: the backend name implementations were registered under (``"cuda"``).
            context: what implementation classes are constructed with, ``cls(context)``, once
                per class and table.
            bind: instead of ``context``: returns the instance of a class that implementation
                methods are bound to (a context that shares instances between op classes).
            use_reference: fall back to the NumPy reference (host-array backends only).
        """
        table = OpTable(backend)
        if bind is None:
            instances: dict[type, Any] = {}

            def bind(cls: type) -> Any:
                if cls not in instances:
                    instances[cls] = cls(context)
                return instances[cls]

        for name in self.names():
            spec = self.specs[name]
            impl = self.impls.get((name, backend))
            if impl is not None:
                fn = _bind(impl, bind)
            elif spec.unfused is not None:
                fn = types.MethodType(resolve(spec.unfused), table)
            elif use_reference:
                fn = resolve(spec.reference)
            else:
                table._missing[name] = self.owner(name)
                continue
            setattr(table, name, fn)
        return table


def _bind(impl: Any, bind: Callable[[type], Any]) -> Callable[..., Any]:
    if not isinstance(impl, str):
        return impl
    module_name, _, attr = impl.partition(":")
    if not attr:
        raise PluginError(f"op implementation {impl!r} must look like 'package.module:attr'")
    *path, last = attr.split(".")
    owner: Any = importlib.import_module(module_name)
    for part in path:
        owner = getattr(owner, part)
    if isinstance(owner, type):
        owner = bind(owner)
    return getattr(owner, last)
