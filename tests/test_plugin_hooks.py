"""atlas_core.hookspecs.registers / registers_ops: hook implementations built from a plugin's
tables, bound to the hook names of a plugin module and collected by a real manager."""

from __future__ import annotations

import types

import pytest

from atlas_core import api
from atlas_core.hookspecs import PROJECT_NAME, registers, registers_ops
from atlas_core.ops.spec import OpSpec
from atlas_core.plugins import Registry, make_plugin_manager

CLS = "fake_ops:FakeCudaOps"


def _spec(name: str) -> OpSpec:
    return OpSpec(name, f"fake_ref:{name}")


def _calls(hook) -> list[tuple]:
    """What ``hook`` registers: ``(name, factory)`` or ``(name, factory, backend)``."""
    calls: list[tuple] = []

    def register(name, factory, *, backend=None):
        calls.append((name, factory) if backend is None else (name, factory, backend))

    hook(register=register)
    return calls


def _registry(**hooks) -> Registry:
    """A registry of the built-ins plus a plugin module ``fake`` with these hook attributes."""
    module = types.ModuleType("fake_plugin")
    for name, hook in hooks.items():
        setattr(module, name, hook)
    pm = make_plugin_manager(entry_points=False)
    pm.register(module, name="fake")
    return Registry(pm)


def test_the_helpers_are_exported_by_the_plugin_api():
    assert api.registers is registers and api.registers_ops is registers_ops


def test_registers_every_item_in_order_and_is_a_hookimpl():
    hook = registers({"b_kind": "pkg.b:B", "a_kind": "pkg.a:A"})
    assert hasattr(hook, f"{PROJECT_NAME}_impl")
    assert _calls(hook) == [("b_kind", "pkg.b:B"), ("a_kind", "pkg.a:A")]


def test_registers_reads_the_mapping_when_called():
    loaders = {"FakeForCausalLM": "pkg.loader:FakeLoader"}
    hook = registers(loaders)
    loaders["FakeVLForConditionalGeneration"] = "pkg.loader:FakeVLLoader"
    assert [name for name, _ in _calls(hook)] == ["FakeForCausalLM",
                                                  "FakeVLForConditionalGeneration"]


def test_bound_to_hook_names_a_plugin_module_registers_through_the_manager():
    reg = _registry(register_layers=registers({"fake_kind": "pkg.layers:FakeLayer"}),
                    register_weight_loaders=registers({"FakeForCausalLM": "pkg.loader:L"}),
                    register_ops=registers_ops((_spec("fake_op"),), classes={"cuda": CLS}))
    assert reg.owner("layers", "fake_kind") == "fake"
    assert reg.entries["weight_loaders"]["FakeForCausalLM"] == ("pkg.loader:L", "fake")
    assert reg.entries["ops"]["fake_op"][1] == "fake"
    assert reg.entries["ops"]["fake_op@cuda"] == (f"{CLS}.fake_op", "fake")


def test_registers_ops_gives_each_spec_the_method_of_its_name_of_each_class():
    first, second = _spec("first"), _spec("second")
    hook = registers_ops([first, second], classes={"cuda": CLS})
    assert hasattr(hook, f"{PROJECT_NAME}_impl")
    assert _calls(hook) == [("first", first), ("first", f"{CLS}.first", "cuda"),
                            ("second", second), ("second", f"{CLS}.second", "cuda")]


def test_registers_ops_columns_take_impls_flags_and_none_in_order():
    a, b, c = _spec("a"), _spec("b"), _spec("c")
    ops = ((a, "pkg.np:a", True), (b, None, "pkg.other:Ops.b"), (c, False, None))
    assert _calls(registers_ops(ops, columns=("numpy", "cuda"), classes={"cuda": CLS})) == [
        ("a", a), ("a", "pkg.np:a", "numpy"), ("a", f"{CLS}.a", "cuda"),
        ("b", b), ("b", "pkg.other:Ops.b", "cuda"),
        ("c", c)]


def test_registers_ops_column_impls_come_before_class_impls():
    a, b = _spec("a"), _spec("b")
    ops = ((a, "pkg.np:a"), (b, None))
    assert _calls(registers_ops(ops, columns=("numpy",), classes={"cuda": CLS})) == [
        ("a", a), ("a", "pkg.np:a", "numpy"), ("a", f"{CLS}.a", "cuda"),
        ("b", b), ("b", f"{CLS}.b", "cuda")]


def test_registers_ops_without_backends_declares_specs_only():
    spec = _spec("only")
    assert _calls(registers_ops([spec])) == [("only", spec)]


def test_registers_ops_rejects_a_row_of_the_wrong_width():
    with pytest.raises(ValueError, match="'a'.*2 implementations"):
        registers_ops([(_spec("a"), "pkg:x", "pkg:y")], columns=("numpy",))


def test_registers_ops_rejects_true_for_a_backend_without_a_class():
    with pytest.raises(ValueError, match="'a'.*'cuda'"):
        registers_ops([(_spec("a"), True)], columns=("cuda",))


@pytest.mark.parametrize("plugin, op", [
    ("deepseek", "mla_latent_cache"), ("gemma4", "softcap"), ("minimax", "moe_route_biased"),
    ("nemotron_h", "mamba2_ssd_chunked"), ("qwen35", "gated_delta_rule_chunked"),
    ("qwen3vl", "layer_norm")])
def test_model_family_plugins_register_their_ops_through_the_helpers(plugin, op):
    reg = Registry(make_plugin_manager())
    if plugin not in {p.name for p in reg.plugins()}:
        pytest.skip(f"plugin {plugin!r} is not installed")
    assert reg.owner("ops", op) == plugin
    assert reg.owner("ops", f"{op}@cuda") == plugin
