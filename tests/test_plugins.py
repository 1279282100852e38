"""atlas_core.plugins: built-ins, lazy factories, fresh managers, allow-list, failures, clashes.

Third-party plugins are faked: small modules written to a temporary directory and handed to
the manager through a monkeypatched ``atlas_core.plugins._entry_points``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest

from atlas_core import plugins
from atlas_core.interfaces import CommBackend, GpuBackend, StorageBackend, TransformerLayer
from atlas_core.plugins import HOOK_KINDS, PluginError, Registry, make_plugin_manager

BUILTINS = {
    "gpu_backends": ({"numpy", "mock"}, GpuBackend),
    "comm_backends": ({"loopback"}, CommBackend),
    "storage_backends": ({"memory", "posix"}, StorageBackend),
    "layers": ({"attention", "mlp", "moe"}, TransformerLayer),
}


class FakeEntryPoint:
    def __init__(self, name: str, module: str) -> None:
        self.name, self.value = name, module
        self.dist = SimpleNamespace(name=f"atlas-{name}")

    def load(self):
        __import__(self.value)
        return sys.modules[self.value]


@pytest.fixture
def fake_plugins(tmp_path, monkeypatch):
    """``add(name, body)`` writes module ``fake_<name>`` and installs it as entry point ``name``."""
    monkeypatch.syspath_prepend(str(tmp_path))
    entry_points: list[FakeEntryPoint] = []
    monkeypatch.setattr(plugins, "_entry_points", lambda: list(entry_points))
    monkeypatch.delenv("ATLAS_PLUGINS", raising=False)
    written: list[str] = []

    def add(name: str, body: str, module: str | None = None) -> None:
        module = module or f"fake_{name}"
        (tmp_path / f"{module}.py").write_text(textwrap.dedent(body))
        written.append(module)
        entry_points.append(FakeEntryPoint(name, module))

    yield add
    for module in written + ["fake_impl"]:
        sys.modules.pop(module, None)


GOOD = """
    from atlas_core.hookspecs import hookimpl

    @hookimpl
    def register_gpu_backends(register):
        register("fake", "fake_impl:FakeBackend")
"""


@pytest.mark.parametrize("kind", sorted(BUILTINS))
def test_builtins_registered_under_every_hook_kind(kind):
    reg = Registry(make_plugin_manager(entry_points=False))
    assert set(reg.entries) == set(HOOK_KINDS.values())
    names, base = BUILTINS[kind]
    assert names <= set(reg.names(kind))
    for name in names:
        assert reg.owner(kind, name).startswith("atlas_core.")
        assert issubclass(reg.get(kind, name), base)


def test_lazy_factory_resolved_only_on_use(fake_plugins, tmp_path):
    (tmp_path / "fake_impl.py").write_text("class FakeBackend:\n    pass\n")
    fake_plugins("good", GOOD)
    reg = Registry(make_plugin_manager())
    assert "fake" in reg.names("gpu_backends") and reg.owner("gpu_backends", "fake") == "good"
    assert "fake_impl" not in sys.modules
    assert reg.get("gpu_backends", "fake").__name__ == "FakeBackend"
    assert "fake_impl" in sys.modules


def test_unknown_name_lists_registered_ones():
    reg = Registry(make_plugin_manager(entry_points=False))
    with pytest.raises(KeyError, match="registered: mock, numpy"):
        reg.get("gpu_backends", "nope")


def test_fresh_manager_per_call(fake_plugins):
    fake_plugins("good", GOOD)
    first, second = make_plugin_manager(), make_plugin_manager(entry_points=False)
    assert first is not second
    assert first.has_plugin("good") and not second.has_plugin("good")
    assert "fake" not in Registry(second).names("gpu_backends")


def test_allow_list_from_env_and_argument(fake_plugins, monkeypatch):
    fake_plugins("good", GOOD)
    fake_plugins("broken", "raise ImportError('must not be imported')\n")
    monkeypatch.setenv("ATLAS_PLUGINS", "good")
    pm = make_plugin_manager()
    assert pm.has_plugin("good") and not pm.has_plugin("broken") and pm.atlas_failures == []
    pm = make_plugin_manager(allow=[])
    assert not pm.has_plugin("good") and pm.has_plugin("atlas_core.backends.plugin")


def test_failing_plugin_reported_and_skipped(fake_plugins):
    fake_plugins("broken", "import not_a_real_module_atlas\n")
    fake_plugins("good", GOOD)
    reg = Registry(make_plugin_manager())
    assert [f.name for f in reg.failures] == ["broken"]
    failure = reg.failures[0]
    assert "ModuleNotFoundError" in failure.error and "not_a_real_module_atlas" in failure.traceback
    assert "Traceback" in failure.traceback
    assert "fake" in reg.names("gpu_backends")


def test_strict_makes_a_failing_plugin_fatal(fake_plugins):
    fake_plugins("broken", "raise RuntimeError('boom')\n")
    with pytest.raises(PluginError, match="'broken'.*boom"):
        make_plugin_manager(strict=True)


def test_same_name_from_two_plugins_is_an_error(fake_plugins):
    fake_plugins("alpha", GOOD)
    fake_plugins("beta", GOOD)
    with pytest.raises(PluginError, match="'alpha'.*'beta'|'beta'.*'alpha'"):
        Registry(make_plugin_manager())


def test_clash_with_a_builtin_names_both(fake_plugins):
    fake_plugins("shadow", GOOD.replace('"fake"', '"numpy"'))
    with pytest.raises(PluginError) as err:
        Registry(make_plugin_manager())
    assert "'atlas_core.backends.plugin'" in str(err.value) and "'shadow'" in str(err.value)


def test_same_entry_point_twice_registers_once(fake_plugins):
    fake_plugins("good", GOOD)
    fake_plugins("good", GOOD)
    reg = Registry(make_plugin_manager())
    assert reg.names("gpu_backends").count("fake") == 1


def test_plugins_listing(fake_plugins):
    fake_plugins("good", GOOD)
    infos = {p.name: p for p in Registry(make_plugin_manager()).plugins()}
    assert infos["good"].dist == "atlas-good"
    assert infos["good"].registered == {"gpu_backends": ["fake"]}
    assert infos["atlas_core.backends.plugin"].registered["gpu_backends"] == ["mock", "numpy"]


def test_importing_plugins_and_builtin_factories_imports_no_gpu_library():
    code = textwrap.dedent("""
        import json, sys
        from atlas_core.plugins import Registry
        reg = Registry()
        for kind in ("comm_backends", "storage_backends"):
            for name in reg.names(kind):
                reg.get(kind, name)
        for name in ("numpy", "mock"):
            reg.get("gpu_backends", name)
        gpu = sorted(m for m in sys.modules
                     if m.split(".")[0] in ("cuda", "cupy", "torch", "pycuda", "nvmath")
                     or m.startswith("numba.cuda"))
        print(json.dumps(gpu))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
