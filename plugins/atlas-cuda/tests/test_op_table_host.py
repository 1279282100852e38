"""The cuda op table is built from the registered ops, bound to one instance per class on the
backend's OpContext, and plugins' kernel folders are searched after the target's (no GPU)."""

from __future__ import annotations

import inspect
import types
from types import SimpleNamespace

import numpy as np

from atlas_core.api import OpRegistry, bfloat16
from atlas_cuda.kernels_loader import KernelLibrary
from atlas_cuda.ops import DenseOps, build_op_table
from atlas_cuda.ops_gemv import GemvOps
from atlas_cuda.plugin import CUDA_OPS
from atlas_cuda.targets import Target, generic_kernel_dir

from fake_context import fake_context

CUDA_OPS_NAMES = [name for names in CUDA_OPS.values() for name in names]


def test_every_registered_op_is_a_bound_method_with_the_reference_signature():
    registry = OpRegistry.load()
    ctx = fake_context()
    table = build_op_table(ctx, registry)
    assert ctx.ops is table
    implemented = {name for name, backend in registry.impls if backend == "cuda"}
    assert set(CUDA_OPS_NAMES) <= implemented
    assert set(table) == {n for n in registry.names()
                          if n in implemented or registry.spec(n).unfused is not None}
    for name in table:
        fn = getattr(table, name)
        assert isinstance(fn, types.MethodType), f"{name}: the table must hold the bound method"
        got = [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]
        want = [(p.name, p.kind, p.default)
                for p in inspect.signature(registry.reference(name)).parameters.values()]
        assert got == want, f"{name}: signature differs from the reference"


def test_each_op_class_is_built_once_and_shared_with_its_callers():
    ctx = fake_context()
    table = build_op_table(ctx, OpRegistry.load())
    dense = ctx.bind(DenseOps)
    assert table.linear.__self__ is dense and table.add.__self__ is dense
    assert table.rms_norm_linear.__self__ is ctx.bind(GemvOps) is dense.gemv
    assert table.moe_block.__self__.gemv is dense.gemv


def test_core_registrations_match_the_classes():
    for cls_path, names in CUDA_OPS.items():
        module, _, cls_name = cls_path.partition(":")
        cls = getattr(__import__(module, fromlist=[cls_name]), cls_name)
        assert all(callable(getattr(cls, n, None)) for n in names), cls_path


def test_sigmoid_mul_runs_its_own_core_module():
    ctx = fake_context()
    table = build_op_table(ctx, OpRegistry.load())
    x = SimpleNamespace(shape=(4, 48), size=192, dtype=np.dtype(bfloat16))
    gate = SimpleNamespace(shape=(4, 1), size=4, dtype=np.dtype(bfloat16))
    table.sigmoid_mul(x, gate)
    (name, _, _, args, _), = ctx.kernels.launches
    assert name == "sigmoid_mul_bf16" and args[3:5] == (48, 1)
    assert (generic_kernel_dir() / "common" / "sigmoid_mul.cu").is_file()


def test_plugin_kernel_folders_come_after_the_target_folders(tmp_path):
    (tmp_path / "toy_op.cu").write_text('#include "common.cuh"\n')
    library = KernelLibrary(Target("cuda", "sm_90a"), SimpleNamespace(), extra_dirs=[tmp_path])
    assert library.sources.search_dirs[-1] == tmp_path
    assert library.sources.find("toy_op.cu") == tmp_path / "toy_op.cu"
    assert library.sources.find("common.cuh").parent == generic_kernel_dir() / "common"
    assert "toy_op" in library.sources.modules()
    assert '#include "common.cuh"' not in library.sources.text("toy_op.cu")


def test_registered_kernel_folders_reach_the_library():
    dirs = OpRegistry.load().kernel_source_dirs()
    if not dirs:
        return
    library = KernelLibrary(Target("cuda", "sm_90a"), SimpleNamespace(), extra_dirs=dirs)
    assert library.sources.search_dirs[-len(dirs):] == dirs
