"""Meta-tests that keep the map honest: hooks, docs, plugins and architectures stay in step."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from atlas_core import hookspecs
from atlas_core.plugins import HOOK_KINDS, Registry, make_plugin_manager

ROOT = Path(__file__).resolve().parents[1]
TEST_DIRS = [ROOT / "tests", *sorted((ROOT / "plugins").glob("*/tests")), *sorted((ROOT / "examples").glob("*/tests"))]
GPU_MODULES = ("cuda", "cupy", "torch", "numba.cuda", "pycuda", "nvmath")


def _test_sources() -> str:
    return "\n".join(p.read_text() for d in TEST_DIRS for p in d.rglob("test_*.py") if p.name != "test_meta.py")


@pytest.mark.parametrize("hook", hookspecs.HOOK_NAMES)
def test_every_hook_has_a_docs_section(hook):
    text = (ROOT / "docs" / "plugins" / "hooks.md").read_text()
    assert re.search(rf"^## {hook}$", text, re.M), f"docs/plugins/hooks.md needs a '## {hook}' section"


@pytest.mark.parametrize("hook", hookspecs.HOOK_NAMES)
def test_every_hook_has_a_test(hook):
    kind = HOOK_KINDS[hook]
    sources = _test_sources()
    assert hook in sources or f'"{kind}"' in sources, f"no test mentions hook {hook} or kind {kind!r}"


def test_every_hook_spec_is_listed():
    declared = {n for n in dir(hookspecs) if n.startswith("register_")}
    assert declared == set(hookspecs.HOOK_NAMES) == set(HOOK_KINDS)


def test_importing_every_plugin_initialises_no_gpu():
    code = (
        "import json, sys\n"
        "from atlas_core.plugins import Registry, make_plugin_manager\n"
        "reg = Registry(make_plugin_manager())\n"
        "print(json.dumps({'plugins': [p.name for p in reg.plugins()],"
        " 'failures': [f.name for f in reg.failures],"
        f" 'gpu': sorted(m for m in sys.modules if m.split('.')[0] in {GPU_MODULES!r} or m in {GPU_MODULES!r})}}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["failures"] == [], result
    assert result["gpu"] == [], f"importing plugins pulled in GPU modules: {result['gpu']}"


def test_every_registered_architecture_has_a_tiny_model_test():
    from atlas_core.testing.checkpoints import tiny_architectures

    reg = Registry(make_plugin_manager())
    archs = set(tiny_architectures(reg))
    assert archs == set(reg.names("weight_loaders")), "every weight loader needs a tiny_config()"
    sources = _test_sources()
    missing = [a for a in sorted(archs) if a not in sources]
    assert not missing, f"architectures with no tiny-model test: {missing}"


def test_test_module_names_are_unique_and_conftest_is_never_imported():
    # pytest imports test dirs without __init__.py by basename: duplicates shadow each other.
    files = [p for d in TEST_DIRS for p in d.glob("*.py")]
    names = [p.name for p in files if p.name != "conftest.py"]
    dupes = sorted({n for n in names if names.count(n) > 1})
    assert not dupes, f"test module basenames must be unique across test folders: {dupes}"
    offenders = [str(p.relative_to(ROOT)) for p in files if re.search(r"^\s*(from|import) conftest\b", p.read_text(), re.M)]
    assert not offenders, f"import helpers from a uniquely named module, not conftest: {offenders}"
