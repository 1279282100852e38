"""Gated DeltaNet as a plugin's ops, end to end: specs and references registered by this plugin,
numpy implementations (numba), CUDA implementations and ``.cu`` sources shipped here, and the
contract tests generated from the specs on numpy, mock and (with a GPU) cuda. HF parity of the
references: test_gdn_ops.py; of whole models: test_qwen35_hf_parity.py; CUDA kernels at model
shapes: test_gdn_cuda.py; NVRTC builds: test_gdn_kernels_compile.py.
"""

from __future__ import annotations

import fnmatch
import inspect
import tomllib
import types
from pathlib import Path

import pytest

from atlas_core.api import OpRegistry, Registry, make_plugin_manager
from atlas_core.testing.contracts_cases import GeneratedOpContract
from atlas_qwen35 import gdn_numpy, gdn_reference
from atlas_qwen35.cuda import kernel_dir
from atlas_qwen35.plugin import OPS

GDN_OPS = [spec.name for spec, _ in OPS]
KERNELS = ("gdn.cu", "delta_rule.cu", "gdn_chunked.cu")


@pytest.fixture(scope="module")
def ops():
    return OpRegistry.load()


def test_specs_come_from_this_plugin_not_core(ops):
    assert set(GDN_OPS) <= set(ops.names())
    for name in GDN_OPS:
        spec = ops.spec(name)
        assert ops.owner(name) == "qwen35" and spec.cases is not None
        assert ops.reference(name) is getattr(gdn_reference, name)
        assert spec.stateful == name.startswith(("causal_conv1d", "gated_delta_rule"))
    assert ops.backends("gated_delta_rule_chunked") == ["cuda", "numpy"]
    core = OpRegistry(Registry(make_plugin_manager(entry_points=False)))
    assert not set(GDN_OPS) & set(core.names())


def test_numpy_table_takes_numba_kernels_unfused_decode_and_references(backend):
    assert backend.ops.gated_delta_rule_chunked is gdn_numpy.gated_delta_rule_chunked
    assert backend.ops.gated_delta_rule_recurrent is gdn_numpy.gated_delta_rule_recurrent
    decode = backend.ops.gated_delta_rule_decode
    assert isinstance(decode, types.MethodType) and decode.__self__ is backend.ops
    assert decode.__func__ is gdn_reference.compose_gdn_decode
    assert backend.ops.causal_conv1d is gdn_reference.causal_conv1d


def test_cuda_implementations_resolve_with_the_reference_signatures(ops):
    pytest.importorskip("atlas_cuda", reason="the [cuda] extra is not installed")
    from atlas_qwen35.cuda.gdn_ops import GdnOps
    for name in GDN_OPS:
        assert ops.impls[(name, "cuda")] == f"atlas_qwen35.cuda.gdn_ops:GdnOps.{name}"
        params = list(inspect.signature(getattr(GdnOps, name)).parameters.values())[1:]
        want = inspect.signature(ops.reference(name)).parameters.values()
        assert [(p.name, p.kind, p.default) for p in params] == \
            [(p.name, p.kind, p.default) for p in want], name


def test_kernel_sources_ship_in_the_wheel(ops):
    assert kernel_dir() in ops.kernel_source_dirs()
    assert all((kernel_dir() / name).is_file() for name in KERNELS)
    root = Path(__file__).resolve().parents[1]
    data = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    patterns = data["package-data"]["atlas_qwen35"]
    package = root / "atlas_qwen35"
    for path in kernel_dir().iterdir():
        rel = path.relative_to(package).as_posix()
        assert any(fnmatch.fnmatch(rel, p) for p in patterns), f"{rel} is not package data"


def test_importing_the_plugin_imports_no_cuda_code():
    import subprocess
    import sys
    code = ("import sys, atlas_qwen35.plugin, atlas_qwen35.cuda; "
            "print(sorted(m for m in sys.modules if m.startswith(('atlas_cuda', 'cuda', "
            "'atlas_qwen35.cuda.gdn_ops', 'numpy'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


class _OnBackend(GeneratedOpContract):
    backend_name = "numpy"

    @pytest.fixture(scope="class")
    @classmethod
    def backend(cls):
        backend = Registry().create("gpu_backends", cls.backend_name)
        yield backend
        backend.close()


class TestGeneratedContractNumpy(_OnBackend):
    """Every spec's cases (the GDN ones from this plugin) on the numpy backend."""


class TestGeneratedContractMock(_OnBackend):
    """The same on the mock backend, which records whatever its table holds."""

    backend_name = "mock"


@pytest.mark.gpu
class TestGeneratedContractCuda(GeneratedOpContract):
    """The same cases on the cuda backend: this plugin's kernels through its wrappers."""

    @pytest.fixture
    def backend(self, cuda_backend):
        return cuda_backend
