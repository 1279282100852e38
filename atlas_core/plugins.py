"""Plugin discovery: built-ins first, then the ``atlas`` entry-point group.

``make_plugin_manager()`` returns a fresh manager every call (no global state), and
``Registry`` collects what every plugin registered under each hook, resolving lazy
``"pkg.module:attr"`` factories on first use.
"""

from __future__ import annotations

import importlib
import logging
import traceback
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

import pluggy

from atlas_core import env, hookspecs

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "atlas"

# Built-in plugins go through the same manager as third-party ones.
DEFAULT_PLUGINS = (
    "atlas_core.ops.plugin",
    "atlas_core.backends.plugin",
    "atlas_core.comm.plugin",
    "atlas_core.storage.plugin",
    "atlas_core.model.plugin",
    "atlas_core.parallel.plugin",
)

# hook name -> the kind of thing it registers, used in messages and `atlas plugins`.
HOOK_KINDS = {
    "register_gpu_backends": "gpu_backends",
    "register_weight_loaders": "weight_loaders",
    "register_layers": "layers",
    "register_comm_backends": "comm_backends",
    "register_storage_backends": "storage_backends",
    "register_ops": "ops",
    "register_kernel_sources": "kernel_sources",
    "register_kernel_targets": "kernel_targets",
}


class PluginError(RuntimeError):
    """A plugin could not be loaded, or two plugins registered the same name."""


@dataclass
class PluginFailure:
    """A plugin that could not be loaded: its entry-point ``name``, the error line and the
    formatted traceback (``atlas plugins`` and ``atlas doctor`` show them)."""

    name: str
    error: str
    traceback: str


@dataclass
class PluginInfo:
    """A loaded plugin: its ``name``, the distribution that ships it (``None`` when unknown) and
    what it registered, ``{kind: [sorted names]}``."""

    name: str
    dist: str | None
    registered: dict[str, list[str]] = field(default_factory=dict)


def resolve(factory: Any) -> Any:
    """Resolve a lazy ``"package.module:attr"`` string; return other factories unchanged."""
    if not isinstance(factory, str):
        return factory
    module_name, _, attr = factory.partition(":")
    if not attr:
        raise PluginError(f"factory {factory!r} must look like 'package.module:attr'")
    obj = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def make_plugin_manager(*, strict: bool = False, allow: list[str] | None = None,
                        entry_points: bool = True) -> pluggy.PluginManager:
    """Build a fresh plugin manager with the built-ins and every installed ``atlas`` plugin.

    Args:
        strict: re-raise when a plugin fails to import, instead of reporting and skipping it.
        allow: names of entry points to load (default: ``ATLAS_PLUGINS``, comma-separated;
            unset means all). Built-ins are always loaded.
        entry_points: set False to load only the built-ins.

    Failures are kept on ``pm.atlas_failures`` as :class:`PluginFailure` records.
    """
    pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    pm.add_hookspecs(hookspecs)
    pm.atlas_failures = []  # type: ignore[attr-defined]
    pm.atlas_dists = {}  # type: ignore[attr-defined]
    for module_name in DEFAULT_PLUGINS:
        pm.register(importlib.import_module(module_name), name=module_name)
    if not entry_points:
        return pm
    allow = allow if allow is not None else env.plugin_allow_list()
    for ep in _entry_points():
        if allow is not None and ep.name not in allow:
            continue
        if pm.has_plugin(ep.name):
            continue
        try:
            plugin = ep.load()
        except Exception as exc:  # noqa: BLE001 - a broken plugin must not take the server down
            if strict:
                raise PluginError(f"plugin {ep.name!r} ({ep.value}) failed to import: {exc}") from exc
            tb = traceback.format_exc()
            log.warning("skipping plugin %r (%s): failed to import\n%s", ep.name, ep.value, tb)
            pm.atlas_failures.append(PluginFailure(ep.name, f"{type(exc).__name__}: {exc}", tb))
            continue
        pm.register(plugin, name=ep.name)
        pm.atlas_dists[ep.name] = ep.dist.name if ep.dist is not None else None
    return pm


def _entry_points() -> list[metadata.EntryPoint]:
    return sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: ep.name)


class Registry:
    """Everything the plugins of one manager registered, by hook.

    >>> reg = Registry(make_plugin_manager())
    >>> backend = reg.create("gpu_backends", "numpy")
    """

    def __init__(self, pm: pluggy.PluginManager | None = None) -> None:
        self.pm = pm if pm is not None else make_plugin_manager()
        self.entries: dict[str, dict[str, tuple[Any, str]]] = {k: {} for k in HOOK_KINDS.values()}
        for hook_name, kind in HOOK_KINDS.items():
            self._collect(hook_name, kind)

    def _collect(self, hook_name: str, kind: str) -> None:
        table = self.entries[kind]
        hook = getattr(self.pm.hook, hook_name)
        for impl in hook.get_hookimpls():
            owner = self.pm.get_name(impl.plugin) or repr(impl.plugin)

            def register(name: str, factory: Any, _owner: str = owner, *,
                         backend: str | None = None) -> None:
                if backend is not None:
                    if kind != "ops":
                        raise PluginError(f"plugin {_owner!r}: only register_ops takes backend=")
                    name = f"{name}@{backend}"
                if name in table and table[name][1] != _owner:
                    raise PluginError(
                        f"{kind} name {name!r} is registered twice: by plugin {table[name][1]!r} "
                        f"and by plugin {_owner!r}; uninstall one or restrict ATLAS_PLUGINS")
                table[name] = (factory, _owner)

            impl.function(register=register)

    def names(self, kind: str) -> list[str]:
        """The sorted names registered under ``kind`` (e.g. ``"gpu_backends"``)."""
        return sorted(self.entries[kind])

    def owner(self, kind: str, name: str) -> str:
        """The name of the plugin that registered ``name`` under ``kind``."""
        return self.entries[kind][name][1]

    def get(self, kind: str, name: str) -> Any:
        """Return the resolved factory registered as ``name`` under ``kind``."""
        try:
            factory, _ = self.entries[kind][name]
        except KeyError:
            known = ", ".join(self.names(kind)) or "none"
            raise KeyError(f"no {kind[:-1].replace('_', ' ')} named {name!r}; registered: {known}") from None
        return resolve(factory)

    def create(self, kind: str, name: str, **kwargs: Any) -> Any:
        """Call the factory registered as ``name`` under ``kind`` with ``kwargs``.

        GPU backends also get ``op_registry``: the ops of this registry's plugins, from which
        they build their ``ops`` table.

        Raises:
            KeyError: nothing is registered under that name (the message lists what is).
        """
        factory = self.get(kind, name)
        if kind == "gpu_backends" and "op_registry" not in kwargs:
            from atlas_core.ops.registry import OpRegistry
            kwargs["op_registry"] = OpRegistry(self)
        return factory(**kwargs)

    def plugins(self) -> list[PluginInfo]:
        """Every plugin the manager loaded, and every owner of a registration, by name."""
        infos: dict[str, PluginInfo] = {}
        for name, plugin in self.pm.list_name_plugin():
            infos[name] = PluginInfo(name, getattr(self.pm, "atlas_dists", {}).get(name, "atlas-core"))
        for kind, table in self.entries.items():
            for thing, (_, owner) in table.items():
                infos.setdefault(owner, PluginInfo(owner, None)).registered.setdefault(kind, []).append(thing)
        for info in infos.values():
            for things in info.registered.values():
                things.sort()
        return sorted(infos.values(), key=lambda i: i.name)

    @property
    def failures(self) -> list[PluginFailure]:
        """The plugins whose import failed (they were skipped)."""
        return list(getattr(self.pm, "atlas_failures", []))
