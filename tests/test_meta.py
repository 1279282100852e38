"""Meta-tests that keep the map honest: hooks, docs, plugins and architectures stay in step."""

from __future__ import annotations

import ast
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


def test_every_registered_op_is_declared_once_documented_and_contract_tested():
    from atlas_core.ops.registry import OpRegistry

    ops = OpRegistry(Registry(make_plugin_manager()))
    orphans = sorted(f"{name}@{backend}" for name, backend in ops.impls if name not in ops.specs)
    assert not orphans, f"implementations of ops no plugin declares: {orphans}"
    undocumented = [n for n in ops.names() if not (ops.reference(n).__doc__ or "").strip()]
    assert not undocumented, ("op references need a docstring (shapes, dtypes, formula): "
                              f"{undocumented}")
    from atlas_core.testing.contracts import GpuBackendContract
    tests = [n for n in dir(GpuBackendContract) if n.startswith("test_")]
    untested = [n for n in ops.names() if ops.spec(n).cases is None
                and not any(t == f"test_{n}" or t.startswith(f"test_{n}_") for t in tests)]
    assert not untested, f"ops with neither contract cases nor a contract test: {untested}"


def test_test_module_names_are_unique_and_conftest_is_never_imported():
    # pytest imports test dirs without __init__.py by basename: duplicates shadow each other.
    files = [p for d in TEST_DIRS for p in d.glob("*.py")]
    names = [p.name for p in files if p.name != "conftest.py"]
    dupes = sorted({n for n in names if names.count(n) > 1})
    assert not dupes, f"test module basenames must be unique across test folders: {dupes}"
    offenders = [str(p.relative_to(ROOT)) for p in files if re.search(r"^\s*(from|import) conftest\b", p.read_text(), re.M)]
    assert not offenders, f"import helpers from a uniquely named module, not conftest: {offenders}"


PLUGIN_ROOTS = [*sorted((ROOT / "plugins").glob("*/")), *sorted((ROOT / "examples").glob("*/"))]


def _core_imports(path: Path) -> list[tuple[int, str]]:
    """``(line, module)`` of every ``atlas_core`` import in ``path`` (``from atlas_core import x``
    counts as module ``atlas_core.x``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "atlas_core":
                found += [(node.lineno, f"atlas_core.{a.name}") for a in node.names]
            else:
                found.append((node.lineno, node.module))
    return [(line, m) for line, m in found if m.split(".")[0] == "atlas_core"]


def _is_allowed(module: str, in_tests: bool) -> bool:
    if module == "atlas_core.api":
        return True
    return in_tests and (module == "atlas_core.testing" or module.startswith("atlas_core.testing."))


def _is_test_code(path: Path) -> bool:
    # Contract-case modules (`OpSpec(cases="pkg.x_cases:...")`) are imported only by tests.
    return "tests" in path.relative_to(ROOT).parts or path.stem.endswith("_cases")


def _plugin_sources() -> list[Path]:
    skip = ("build", "__pycache__")
    return [p for root in PLUGIN_ROOTS for p in sorted(root.rglob("*.py"))
            if not any(part in skip or part.endswith(".egg-info") for part in p.parts)]


def test_plugins_import_core_only_through_the_plugin_api():
    offenders = []
    for path in _plugin_sources():
        in_tests = _is_test_code(path)
        offenders += [f"{path.relative_to(ROOT)}:{line}: {module}"
                      for line, module in _core_imports(path) if not _is_allowed(module, in_tests)]
    assert not offenders, ("in-tree plugins may import only atlas_core.api (and, in tests and "
                           "contract-case modules, atlas_core.testing); add what they need to "
                           "atlas_core.api:\n" + "\n".join(offenders))


def test_import_rule_sees_every_form_of_core_import(tmp_path):
    source = tmp_path / "mod.py"
    source.write_text("import atlas_core.ops\nfrom atlas_core import env, api\n"
                      "from atlas_core.api import hookimpl\nfrom atlas_core.testing.forward import X\n"
                      "def f():\n    from atlas_core.model.params import Module\n")
    modules = [m for _, m in _core_imports(source)]
    assert modules == ["atlas_core.ops", "atlas_core.env", "atlas_core.api", "atlas_core.api",
                       "atlas_core.testing.forward", "atlas_core.model.params"]
    assert [_is_allowed(m, in_tests=False) for m in modules] == [False, False, True, True, False,
                                                                 False]
    assert _is_allowed("atlas_core.testing.forward", in_tests=True)
    assert _is_test_code(ROOT / "examples" / "atlas-toy" / "atlas_toy" / "softcap_cases.py")
    assert not _is_test_code(ROOT / "examples" / "atlas-toy" / "atlas_toy" / "softcap.py")
