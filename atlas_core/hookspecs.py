"""The plugin points of Atlas.

Every hook only *registers*: it receives a ``register(name, factory)`` callable and calls it once
per thing the plugin provides. ``factory`` is either a callable or a lazy ``"package.module:attr"``
string; strings are resolved only when the thing is first used, so importing a plugin never
touches a GPU or imports a heavy library. What a registered factory must build is described by
the ABCs in :mod:`atlas_core.interfaces`.

A plugin is any module (or object) with functions of these names decorated with
:data:`hookimpl`, advertised through the ``atlas`` entry-point group::

    [project.entry-points.atlas]
    qwen3 = "atlas_qwen3.plugin"
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping, Sequence

import pluggy

PROJECT_NAME = "atlas"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)

Register = Callable[[str, object], None]


@hookspec
def register_gpu_backends(register: Register) -> None:
    """Register GPU (compute) backends by name, e.g. ``"cuda"``, ``"numpy"``, ``"mock"``.

    The factory is called with keyword options (``device_id``, ``memory_utilization``…) it may
    ignore, and returns a :class:`~atlas_core.interfaces.GpuBackend`.

    Since: 0.1
    """


@hookspec
def register_weight_loaders(register: Register) -> None:
    """Register model-weight loaders by HF ``architectures`` string, e.g. ``"Qwen3ForCausalLM"``.

    The factory is called with one keyword, ``registry`` (the
    :class:`~atlas_core.plugins.Registry` it was found in, where the loader looks up layer
    kinds), and returns a :class:`~atlas_core.interfaces.ModelWeightLoader`.

    Since: 0.1 (the ``registry`` keyword: 0.2)
    """


@hookspec
def register_layers(register: Register) -> None:
    """Register transformer layer kinds, e.g. ``"attention"``, ``"mlp"``, ``"moe"``.

    The factory is a :class:`~atlas_core.interfaces.TransformerLayer` subclass (or a callable
    building one from keyword arguments). Weight loaders look layer kinds up by name, so a
    model family can use kinds other plugins provide (a name may be registered only once).

    Since: 0.1
    """


@hookspec
def register_comm_backends(register: Register) -> None:
    """Register collective-communication backends, e.g. ``"loopback"``, ``"nccl"``.

    The factory is called with ``rank`` and ``world_size`` keywords and returns a
    :class:`~atlas_core.interfaces.CommBackend`.

    Since: 0.1
    """


@hookspec
def register_storage_backends(register: Register) -> None:
    """Register KV-block storage backends, e.g. ``"memory"``, ``"posix"``, ``"io_uring"``.

    The factory is called with keyword options (``root`` for file-backed ones) and returns a
    :class:`~atlas_core.interfaces.StorageBackend`.

    Since: 0.1
    """


@hookspec
def register_ops(register: Register) -> None:
    """Register op specs, and implementations of ops for a backend.

    ``register(name, OpSpec(...))`` declares op ``name`` (:class:`~atlas_core.ops.spec.OpSpec`:
    NumPy reference, in-place / stateful flags, optional unfused definition and contract
    cases). ``register(name, impl, backend="cuda")`` gives a backend's implementation of it:
    a lazy ``"pkg.module:Class.method"`` string (bound to one ``Class(context)`` per backend
    instance) or ``"pkg.module:function"``. Each backend's ``ops`` table is built from these
    when the backend is created (:meth:`~atlas_core.ops.registry.OpRegistry.build_table`);
    an op may be declared by one plugin only, and each (op, backend) implemented by one.

    Since: 0.2
    """


@hookspec
def register_kernel_sources(register: Register) -> None:
    """Register folders of CUDA kernel sources (``.cu`` / ``.cuh``) a plugin ships.

    The factory returns the folder (a :class:`~pathlib.Path` or a callable returning one,
    e.g. ``"atlas_qwen35.cuda:kernel_dir"``). The cuda backend searches these folders, in name
    order, after the hardware target's folders and its own generic sources, so a module named
    like the file is compiled and cached as any other (same cache key).

    Since: 0.2
    """


@hookspec
def register_kernel_targets(register: Register) -> None:
    """Register hardware targets of the cuda backend, e.g. ``"hopper"``, ``"gb10"``.

    The factory takes no arguments and returns an :class:`atlas_cuda.targets.Target` (NVRTC
    arch, compute capabilities it serves, its ``kernels/<hw>/`` folder and parsed
    ``HARDWARE.toml``, whose ``[policy]`` gives the target's kernel policy defaults). The cuda
    backend picks the target serving the device's compute capability, else its generic one.

    Since: 0.2
    """


HOOK_NAMES = (
    "register_gpu_backends",
    "register_weight_loaders",
    "register_layers",
    "register_comm_backends",
    "register_storage_backends",
    "register_ops",
    "register_kernel_sources",
    "register_kernel_targets",
)


# -- Building hook implementations from data ---------------------------------------------------
# Most plugins register a table of lazy strings under a hook; these build that hook from the
# table, so a plugin module binds it to the hook's name: ``register_layers = registers(LAYERS)``
# (pluggy reads the module's attribute of that name). Their names must not start with
# ``register_``: those are hook specs.

HookImpl = Callable[[Register], None]


def registers(entries: Mapping[str, object]) -> HookImpl:
    """A hook implementation that registers every ``name: factory`` item of ``entries``.

    For any hook whose plugins register a table, e.g. in a model family's ``plugin.py``::

        LAYERS = {"mla_attention": "atlas_deepseek.mla:MLAttention"}
        LOADERS = {"DeepseekV3ForCausalLM": "atlas_deepseek.loader:DeepseekV3Loader"}

        register_layers = registers(LAYERS)
        register_weight_loaders = registers(LOADERS)

    The mapping is read when the hook is called, in its order, so items a plugin adds to it
    at import time (after binding the hook) are registered too.

    Since: 0.2
    """

    @hookimpl
    def hook(register: Register) -> None:
        for name, factory in entries.items():
            register(name, factory)

    hook.__qualname__ = hook.__name__ = "registers"
    return hook


def registers_ops(ops: Iterable[Any], *, columns: Sequence[str] = (),
                  classes: Mapping[str, str] | None = None) -> HookImpl:
    """A ``register_ops`` implementation declaring op specs and registering their backend
    implementations.

    Args:
        ops: each an :class:`~atlas_core.ops.spec.OpSpec`, or a tuple ``(spec, impl, ...)``
            with one ``impl`` per backend of ``columns``, in that order. An ``impl`` is the
            implementation (a lazy ``"pkg.module:Class.method"`` / ``"pkg.module:function"``
            string or a callable); ``True``: the method named like the op of that backend's
            class in ``classes``; ``None`` or ``False``: none (the backend runs the op's unfused
            definition, or, for numpy, its reference).
        columns: the backends the tuples' implementations are for, e.g. ``("numpy", "cuda")``.
        classes: backend -> ``"pkg.module:Class"``. A backend not in ``columns`` gets, for every
            op, the method of the op's name of its class (``f"{cls}.{spec.name}"``).

    Per op, in order: ``register(spec.name, spec)``, then its ``columns`` implementations, then
    those of the other ``classes``, each ``register(spec.name, impl, backend=backend)``. ``ops``
    is read once, here (so a malformed table fails the plugin's import)::

        register_ops = registers_ops(OPS, columns=("numpy",), classes={"cuda": CUDA_OPS})

    Raises:
        ValueError: a tuple without one implementation per column, or ``True`` for a backend
            without a class.

    Since: 0.2
    """
    columns = tuple(columns)
    classes = dict(classes or {})
    plan: list[tuple[Any, list[tuple[str, Any]]]] = []
    for entry in ops:
        spec, *impls = entry if isinstance(entry, tuple) else (entry,)
        if impls and len(impls) != len(columns):
            raise ValueError(f"op {spec.name!r}: {len(impls)} implementations for columns "
                             f"{columns!r}")
        backends: list[tuple[str, Any]] = []
        for backend, impl in zip(columns, impls):
            if impl is True:
                if backend not in classes:
                    raise ValueError(f"op {spec.name!r}: True for backend {backend!r}, which has "
                                     "no class in classes")
                impl = f"{classes[backend]}.{spec.name}"
            if impl is not None and impl is not False:
                backends.append((backend, impl))
        backends += [(backend, f"{cls}.{spec.name}") for backend, cls in classes.items()
                     if backend not in columns]
        plan.append((spec, backends))

    @hookimpl
    def hook(register: Register) -> None:
        for spec, backends in plan:
            register(spec.name, spec)
            for backend, impl in backends:
                register(spec.name, impl, backend=backend)

    hook.__qualname__ = hook.__name__ = "registers_ops"
    return hook
