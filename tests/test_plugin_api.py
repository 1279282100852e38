"""atlas_core.api: the one module plugins import from core."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import atlas_core.api as api


@pytest.mark.parametrize("name", api.__all__)
def test_every_exported_name_resolves(name):
    assert getattr(api, name) is not None


def test_an_unlisted_name_says_what_plugins_may_use():
    with pytest.raises(AttributeError, match=r"atlas_core.api.__all__"):
        api.Workspace  # noqa: B018 - the attribute access is the test


def test_importing_the_hook_marker_imports_no_model_op_or_engine_code():
    code = ("import json, sys\nfrom atlas_core.api import hookimpl\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('atlas_core.')"
            " or m == 'numpy')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = json.loads(out.stdout)
    assert loaded == ["atlas_core.api", "atlas_core.hookspecs"], loaded


def test_exports_are_the_core_objects_themselves():
    from atlas_core.hookspecs import hookimpl
    from atlas_core.interfaces import StepMetadata
    from atlas_core.ops import reference

    assert api.hookimpl is hookimpl
    assert api.StepMetadata is StepMetadata
    assert api.reference is reference
