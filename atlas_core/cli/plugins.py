"""``atlas plugins``: every plugin, its distribution, what it registered, and what failed
(kernel targets are built, so a broken ``HARDWARE.toml`` shows up here and fails ``--strict``)."""

from __future__ import annotations

import argparse
import json


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("plugins", help="list installed plugins and what they register",
                              description="List every plugin (built-in and installed), its "
                                          "distribution, what it registered per hook, and "
                                          "plugins that failed to load.")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--strict", action="store_true",
                   help="exit with status 1 when any plugin failed to load")
    return p


def collect() -> dict:
    """``{"plugins": [...], "failures": [...]}`` for the current environment."""
    from atlas_core.plugins import PluginError, Registry, make_plugin_manager

    pm = make_plugin_manager()
    failures = [{"name": f.name, "error": f.error} for f in getattr(pm, "atlas_failures", [])]
    try:
        registry = Registry(pm)
    except PluginError as exc:
        failures.append({"name": "(registry)", "error": str(exc)})
        return {"plugins": [], "failures": failures}
    targets = _kernel_targets(registry, failures)
    plugins = [{"name": info.name, "distribution": info.dist, "registered": info.registered}
               for info in registry.plugins()]
    for plugin in plugins:
        provides = [targets[n] for n in plugin["registered"].get("kernel_targets", ())
                    if n in targets]
        if provides:
            plugin["kernel_targets"] = provides
    return {"plugins": plugins, "failures": failures}


def _kernel_targets(registry, failures: list[dict]) -> dict[str, dict]:
    """Build each registered kernel target: ``{name: {name, arch, gpus}}``; a target that fails
    (atlas-cuda missing, a broken HARDWARE.toml) is added to ``failures``."""
    names = registry.names("kernel_targets")
    if not names:
        return {}
    try:
        from atlas_cuda.targets import load_targets
    except ImportError as exc:
        failures += [{"name": f"kernel target {n}", "error": f"atlas-cuda not importable: {exc}"}
                     for n in names]
        return {}
    built, broken = load_targets(registry)
    failures += [{"name": f"kernel target {n}", "error": err} for n, err in broken]
    return {t.name: {"name": t.name, "arch": t.arch,
                     "gpus": [".".join(map(str, c)) for c in t.compute_capabilities]}
            for t in built}


def run(args) -> int:
    report = collect()
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for plugin in report["plugins"]:
            print(f"{plugin['name']}  ({plugin['distribution'] or 'unknown distribution'})")
            if not plugin["registered"]:
                print("    (registers nothing)")
            for kind, names in sorted(plugin["registered"].items()):
                print(f"    {kind}: {', '.join(names)}")
            for t in plugin.get("kernel_targets", ()):
                print(f"    kernel target {t['name']}: {t['arch']} for GPUs "
                      f"{', '.join(t['gpus']) or 'none'}")
        for failure in report["failures"]:
            print(f"FAILED {failure['name']}: {failure['error']}")
    return 1 if args.strict and report["failures"] else 0
