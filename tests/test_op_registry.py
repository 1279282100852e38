"""Ops are registered specs: register_ops / register_kernel_sources, op tables, generated contract.

A fake plugin (written to a temporary directory, loaded through a monkeypatched entry-point
list) declares an op with a reference, a numpy implementation, an unfused definition and
contract cases, and never touches atlas-core.
"""

from __future__ import annotations

import sys
import textwrap
import types
from types import SimpleNamespace

import numpy as np
import pytest

from atlas_core import plugins
from atlas_core.backends.mock_backend import MockGpuBackend
from atlas_core.backends.numpy_backend import NumpyBackend
from atlas_core.backends.numpy_ops import NumpyOps
from atlas_core.ops.plugin import CORE_OPS
from atlas_core.ops.registry import OpRegistry
from atlas_core.ops.spec import OpSpec
from atlas_core.plugins import PluginError, Registry, make_plugin_manager
from atlas_core.testing.contracts_cases import check_case, registered_cases

TOY = """
    import numpy as np
    from atlas_core.hookspecs import hookimpl
    from atlas_core.ops.spec import OpSpec
    from atlas_core.testing.contracts_cases import OpCase


    def square_add(x, y, *, scale=1.0):
        '''``scale * x * x + y`` in float32, stored in ``x.dtype``.'''
        return (scale * x.astype(np.float32) ** 2 + y).astype(x.dtype)


    def unfused_square_add(ops, x, y, *, scale=1.0):
        return ops.add(ops.toy_mul(x, x, scale=scale), y)


    def toy_mul(x, y, *, scale=1.0):
        '''``scale * x * y``.'''
        return (scale * x.astype(np.float32) * y).astype(x.dtype)


    def cases():
        x = np.linspace(-2, 2, 24, dtype=np.float32).reshape(4, 6)
        return [OpCase("f32", (x, x + 1), {"scale": 0.5})]


    class ToyOps:
        instances = 0

        def __init__(self, context):
            self.context = context
            ToyOps.instances += 1

        def toy_mul(self, x, y, *, scale=1.0):
            return toy_mul(x, y, scale=scale)


    @hookimpl
    def register_ops(register):
        register("square_add", OpSpec("square_add", "fake_toy:square_add",
                                      unfused="fake_toy:unfused_square_add", cases="fake_toy:cases"))
        register("toy_mul", OpSpec("toy_mul", "fake_toy:toy_mul"))
        register("toy_mul", "fake_toy:ToyOps.toy_mul", backend="numpy")
        register("toy_mul", "fake_toy:ToyOps.toy_mul", backend="fake")


    @hookimpl
    def register_kernel_sources(register):
        register("toy", "fake_toy:kernel_dir")


    def kernel_dir():
        return "/opt/toy/kernels"
"""


class FakeEntryPoint:
    def __init__(self, name: str, module: str) -> None:
        self.name, self.value = name, module
        self.dist = SimpleNamespace(name=f"atlas-{name}")

    def load(self):
        __import__(self.value)
        return sys.modules[self.value]


@pytest.fixture
def add_plugin(tmp_path, monkeypatch):
    """``add(name, body)`` writes module ``fake_<name>`` and installs it as entry point ``name``."""
    monkeypatch.syspath_prepend(str(tmp_path))
    entry_points: list[FakeEntryPoint] = []
    monkeypatch.setattr(plugins, "_entry_points", lambda: list(entry_points))
    monkeypatch.delenv("ATLAS_PLUGINS", raising=False)

    def add(name: str, body: str) -> None:
        (tmp_path / f"fake_{name}.py").write_text(textwrap.dedent(body))
        entry_points.append(FakeEntryPoint(name, f"fake_{name}"))

    yield add
    for name in [e.value for e in entry_points]:
        sys.modules.pop(name, None)


def test_core_ops_are_registered_specs_through_the_plugin_manager():
    ops = OpRegistry(Registry(make_plugin_manager(entry_points=False)))
    parallel = {name for name in ops.names() if ops.owner(name) == "atlas_core.parallel.plugin"}
    assert parallel == {"embedding_shard", "gather_vocab_shards", "moe_remap_ids"}
    assert sorted(set(ops.names()) - parallel) == sorted(spec.name for spec in CORE_OPS)
    assert all(ops.owner(name) == "atlas_core.ops.plugin" for name in set(ops.names()) - parallel)
    assert ops.spec("reshape_and_cache").inplace and not ops.spec("linear").writes_args
    assert "gated_delta_rule_decode" not in ops.names(), "Gated DeltaNet lives in atlas-qwen35"


def test_numpy_table_holds_the_implementations_themselves():
    backend = NumpyBackend(op_registry=OpRegistry(Registry(make_plugin_manager(entry_points=False))))
    # The backend's own method, bound once: no wrapper between the caller and the op.
    assert isinstance(backend.ops.linear, types.MethodType)
    assert backend.ops.linear.__func__ is NumpyOps.linear
    assert backend.ops.linear.__self__ is backend.ops.rms_norm.__self__
    from atlas_core.backends import numpy_attention
    from atlas_core.ops import attention, norm
    assert backend.ops.paged_attention is numpy_attention.paged_attention
    assert backend.ops.rotary_embedding.__module__ == "atlas_core.ops.rotary"
    assert backend.ops.rms_norm_linear.__func__ is norm.compose_rms_norm_linear
    assert backend.ops.rms_norm_linear.__self__ is backend.ops
    assert backend.ops.rope_cache_attention.__func__ is attention.compose_rope_cache_attention


def test_a_plugin_op_gets_spec_numpy_unfused_and_contract_without_core_edits(add_plugin):
    add_plugin("toy", TOY)
    reg = Registry(make_plugin_manager())
    ops = OpRegistry(reg)
    assert {"square_add", "toy_mul"} <= set(ops.names()) and ops.owner("toy_mul") == "toy"
    assert ops.backends("toy_mul") == ["fake", "numpy"]
    backend = reg.create("gpu_backends", "numpy")
    assert backend.ops.square_add.__func__ is sys.modules["fake_toy"].unfused_square_add
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_allclose(backend.ops.square_add(x, x, scale=2.0), 2 * x * x + x)
    cases = [(n, c) for n, c in registered_cases(ops) if n == "square_add"]
    assert len(cases) == 1
    check_case(backend, ops, *cases[0])
    mock = reg.create("gpu_backends", "mock")
    with mock.record() as rec:
        mock.ops.square_add(x, x)
    assert rec.names("launch") == ["square_add"]


def test_implementation_classes_are_built_once_per_table_with_the_context(add_plugin):
    add_plugin("toy", TOY)
    ops = OpRegistry(Registry(make_plugin_manager()))
    toy = sys.modules["fake_toy"]
    before = toy.ToyOps.instances
    context = object()
    table = ops.build_table("fake", context)
    assert toy.ToyOps.instances == before + 1 and table.toy_mul.__self__.context is context
    shared = toy.ToyOps("shared")
    table = ops.build_table("fake", bind=lambda cls: shared)
    assert table.toy_mul.__self__ is shared


def test_missing_op_names_its_plugin_and_how_to_add_it(add_plugin):
    add_plugin("toy", TOY)
    ops = OpRegistry(Registry(make_plugin_manager()))
    table = ops.build_table("gpu9", object())
    assert "toy_mul" not in table and "square_add" in table
    with pytest.raises(AttributeError, match=r"'toy_mul' \(registered by plugin 'toy'\) has no "
                                             r"gpu9 implementation.*backend='gpu9'"):
        table.toy_mul
    with pytest.raises(AttributeError, match="no op named 'nope' is registered"):
        table.nope


def test_declaring_a_core_op_again_names_both_plugins(add_plugin):
    add_plugin("shadow", """
        from atlas_core.hookspecs import hookimpl
        from atlas_core.ops.spec import OpSpec

        @hookimpl
        def register_ops(register):
            register("linear", OpSpec("linear", "shadow:linear"))
    """)
    with pytest.raises(PluginError) as err:
        Registry(make_plugin_manager())
    assert "'atlas_core.ops.plugin'" in str(err.value) and "'shadow'" in str(err.value)


def test_a_second_numpy_implementation_names_both_plugins(add_plugin):
    add_plugin("other", """
        from atlas_core.hookspecs import hookimpl

        @hookimpl
        def register_ops(register):
            register("linear", "other:linear", backend="numpy")
    """)
    with pytest.raises(PluginError, match="'linear@numpy'.*'atlas_core.backends.plugin'.*'other'"):
        Registry(make_plugin_manager())


@pytest.mark.parametrize("body,message", [
    ('register("toy_op", "fake_bad:toy_op")', "register an OpSpec"),
    ('register("toy_op", OpSpec("other", "fake_bad:toy_op"))', "under the name 'toy_op'"),
])
def test_bad_op_registrations_say_what_to_do(add_plugin, body, message):
    add_plugin("bad", f"""
        from atlas_core.hookspecs import hookimpl
        from atlas_core.ops.spec import OpSpec

        @hookimpl
        def register_ops(register):
            {body}
    """)
    with pytest.raises(PluginError, match=message):
        OpRegistry(Registry(make_plugin_manager()))


def test_backend_keyword_belongs_to_register_ops_only(add_plugin):
    add_plugin("bad", """
        from atlas_core.hookspecs import hookimpl

        @hookimpl
        def register_layers(register):
            register("toy", "fake_bad:Toy", backend="cuda")
    """)
    with pytest.raises(PluginError, match="only register_ops takes backend="):
        Registry(make_plugin_manager())


def test_op_names_must_be_identifiers():
    with pytest.raises(ValueError, match="identifier"):
        OpSpec("rms-norm", "x:y")


def test_kernel_source_folders_are_registered_lazily(add_plugin):
    add_plugin("toy", TOY)
    reg = Registry(make_plugin_manager())
    assert reg.names("kernel_sources")[-1] == "toy"
    assert str(OpRegistry(reg).kernel_source_dirs()[-1]) == "/opt/toy/kernels"


def test_mock_records_every_op_of_its_table():
    backend = MockGpuBackend()
    assert list(backend.ops) == list(NumpyBackend().ops)
    x = np.ones((2, 8), np.float32)
    with backend.record() as rec:
        backend.ops.sigmoid_mul(x, x)
    assert rec.names("launch") == ["sigmoid_mul"]
