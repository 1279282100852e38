"""`atlas plugins`: every plugin, its distribution, registrations, and failures."""

import json
from importlib import metadata

import pytest

from atlas_core.cli import main
from atlas_core.cli import plugins as plugins_cli


def test_json_lists_builtins(capsys):
    assert main(["plugins", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    by_name = {p["name"]: p for p in data["plugins"]}
    backends = by_name["atlas_core.backends.plugin"]
    assert backends["distribution"] == "atlas-core"
    assert {"numpy", "mock"} <= set(backends["registered"]["gpu_backends"])
    assert "attention" in by_name["atlas_core.model.plugin"]["registered"]["layers"]


def test_text_output(capsys):
    assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    assert "atlas_core.backends.plugin  (atlas-core)" in out and "gpu_backends: " in out


class BrokenEntryPoint:
    name = "broken"
    value = "broken_plugin:nothing"
    dist = None

    def load(self):
        raise ImportError("No module named 'broken_plugin'")


def test_failures_are_reported_and_strict_fails(monkeypatch, capsys):
    from atlas_core import plugins
    monkeypatch.setattr(plugins, "_entry_points", lambda: [BrokenEntryPoint()])
    assert main(["plugins"]) == 0
    assert "FAILED broken: ImportError: No module named 'broken_plugin'" in capsys.readouterr().out
    assert main(["plugins", "--strict", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["failures"] == [{"name": "broken",
                                   "error": "ImportError: No module named 'broken_plugin'"}]


def test_collect_matches_installed_entry_points():
    names = {p["name"] for p in plugins_cli.collect()["plugins"]}
    for ep in metadata.entry_points(group="atlas"):
        assert ep.name in names


def test_hardware_targets_are_plugins_listed_with_what_they_provide(capsys):
    """atlas-hopper / atlas-gb10 register through the ``register_kernel_targets`` hook: listed
    like every plugin, with the arch and GPUs each target serves."""
    pytest.importorskip("atlas_cuda")
    by_name = {p["name"]: p for p in plugins_cli.collect()["plugins"]}
    for name, arch, gpus in (("hopper", "sm_90a", ["9.0"]), ("gb10", "sm_121", ["12.1"])):
        assert by_name[name]["registered"]["kernel_targets"] == [name]
        assert by_name[name]["kernel_targets"] == [{"name": name, "arch": arch, "gpus": gpus}]
    assert main(["plugins"]) == 0
    assert "kernel target hopper: sm_90a for GPUs 9.0" in capsys.readouterr().out


def test_a_broken_kernel_target_fails_strict(monkeypatch, capsys):
    pytest.importorskip("atlas_cuda")
    from atlas_core.hookspecs import hookimpl
    from atlas_core import plugins

    class BrokenTarget:
        @hookimpl
        def register_kernel_targets(self, register):
            register("brokenhw", "atlas_cuda.targets:Target.from_dir")

    real = plugins.make_plugin_manager

    def with_broken(**kwargs):
        pm = real(**kwargs)
        pm.register(BrokenTarget(), name="brokenhw-plugin")
        return pm

    monkeypatch.setattr(plugins, "make_plugin_manager", with_broken)
    assert main(["plugins", "--strict", "--json"]) == 1
    failures = json.loads(capsys.readouterr().out)["failures"]
    assert [f["name"] for f in failures] == ["kernel target brokenhw"]
    assert "TypeError" in failures[0]["error"]
    assert main(["plugins"]) == 0
