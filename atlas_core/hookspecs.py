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

from typing import Callable

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
