"""``atlas plugins``: every plugin, its distribution, what it registered, and what failed."""

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
    plugins = [{"name": info.name, "distribution": info.dist, "registered": info.registered}
               for info in registry.plugins()]
    return {"plugins": plugins, "failures": failures}


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
        for failure in report["failures"]:
            print(f"FAILED {failure['name']}: {failure['error']}")
    return 1 if args.strict and report["failures"] else 0
