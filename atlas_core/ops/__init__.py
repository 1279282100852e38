"""The op contract.

Each op is declared once as an :class:`~atlas_core.ops.spec.OpSpec` registered through the
``register_ops`` hook (core's in :mod:`atlas_core.ops.plugin`, a model family's in its plugin):
its name, NumPy reference (whose docstring states shapes, dtypes and the formula), in-place /
stateful flags and optional unfused definition. One name runs across the CUDA source,
``backend.ops.<name>``, the reference, the generated contract test and a micro-benchmark.
Each backend's ``ops`` table is built from what is registered
(:meth:`~atlas_core.ops.registry.OpRegistry.build_table`). The core references are collected
in :mod:`atlas_core.ops.reference`.

Ops return new arrays (taken from the backend's step workspace) except in-place ones
(``OpSpec.inplace``), which write into arrays they are given. Importing this package is free
(no NumPy): plugins' entry-point modules import :class:`OpSpec` from it.
"""

from atlas_core.ops.spec import OpSpec

__all__ = ["OpSpec"]
