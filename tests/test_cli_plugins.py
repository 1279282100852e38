"""`atlas plugins`: every plugin, its distribution, registrations, and failures."""

import json
from importlib import metadata

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
