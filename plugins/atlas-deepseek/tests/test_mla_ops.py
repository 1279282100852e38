"""The MLA and grouped-routing ops as this plugin's ops: specs and references registered here,
CUDA implementations with the reference signatures, ``.cu`` sources shipped as package data,
importing the plugin imports no CUDA code, and every case of these specs on the numpy and mock
backends (and, marker ``gpu``, on cuda: ``test_mla_cuda.py``). Also: absorbed and expanded
attention agree (the two forms of one attention)."""

from __future__ import annotations

import fnmatch
import inspect
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest

from atlas_core.api import OpRegistry, Registry, make_plugin_manager
from atlas_core.testing.contracts_cases import check_case
from atlas_deepseek import mla_reference as ref
from atlas_deepseek.cuda import kernel_dir
from atlas_deepseek.plugin import OPS
from atlas_core.api import resolve

NAMES = [spec.name for spec, _ in OPS]


@pytest.fixture(scope="module")
def ops():
    return OpRegistry(Registry(make_plugin_manager(allow=["deepseek"])))


def _cases(ops):
    return [(name, case) for name in NAMES for case in resolve(ops.spec(name).cases)()]


def test_specs_come_from_this_plugin(ops):
    for spec, on_cuda in OPS:
        assert ops.owner(spec.name) == "deepseek" and ops.spec(spec.name).cases
        assert ops.backends(spec.name) == (["cuda"] if on_cuda else [])
    assert ops.spec("mla_latent_cache").inplace


def test_cuda_implementations_have_the_reference_signatures(ops):
    pytest.importorskip("atlas_cuda", reason="the [cuda] extra is not installed")
    from atlas_deepseek.cuda.mla_ops import MlaCudaOps
    for spec, on_cuda in OPS:
        if on_cuda:
            got = list(inspect.signature(getattr(MlaCudaOps, spec.name)).parameters.values())[1:]
            want = inspect.signature(ops.reference(spec.name)).parameters.values()
            assert [(p.name, p.kind, p.default) for p in got] == \
                [(p.name, p.kind, p.default) for p in want], spec.name


def test_kernel_sources_ship_in_the_wheel(ops):
    assert kernel_dir() in ops.kernel_source_dirs()
    root = Path(__file__).resolve().parents[1]
    data = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    patterns = data["package-data"]["atlas_deepseek"]
    for path in kernel_dir().iterdir():
        rel = path.relative_to(root / "atlas_deepseek").as_posix()
        assert any(fnmatch.fnmatch(rel, p) for p in patterns), f"{rel} is not package data"


def test_importing_the_plugin_imports_no_cuda_code():
    code = ("import sys, atlas_deepseek.plugin, atlas_deepseek.cuda, atlas_mistral.plugin; "
            "print(sorted(m for m in sys.modules if m.startswith(('atlas_cuda', 'cuda', "
            "'atlas_deepseek.cuda.mla_ops', 'numpy', 'torch'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("backend_name", ["numpy", "mock"])
def test_every_case_on_cpu_backends(ops, backend_name):
    backend = Registry(make_plugin_manager(allow=["deepseek"])).create("gpu_backends",
                                                                        backend_name)
    try:
        for name, case in _cases(ops):
            assert name in backend.ops
            check_case(backend, ops, name, case)
    finally:
        backend.close()


def test_absorbed_attention_equals_expanded():
    """Folding W_UK into the query and W_UV after attention is the same attention."""
    rng = np.random.default_rng(0)
    heads, rank, rope, nope, v, bs = 4, 32, 8, 16, 16, 16
    seq_lens, cu = np.array([9, 20], np.int32), np.array([0, 9, 12], np.int32)
    cache = rng.standard_normal((4, bs, 1, rank + rope)).astype(np.float32)
    tables = np.array([[0, 1], [3, 2]], np.int32)
    kv_b = (rng.standard_normal((heads * (nope + v), rank)) / rank ** 0.5).astype(np.float32)
    q_nope = rng.standard_normal((12, heads, nope)).astype(np.float32)
    q_pe = rng.standard_normal((12, heads, rope)).astype(np.float32)
    scale = (nope + rope) ** -0.5
    c, k_pe = ref.mla_gather_latent(cache, tables, seq_lens, 29, rank)
    kv = (c @ kv_b.T).reshape(29, heads, nope + v)
    expanded = ref.mla_expanded_attention(q_nope, q_pe, kv, k_pe, seq_lens, cu, scale)
    o_lat = ref.mla_absorbed_attention(ref.mla_absorb_query(q_nope, kv_b), q_pe, cache, tables,
                                       seq_lens, cu, scale)
    absorbed = ref.mla_absorb_output(o_lat, kv_b, v)
    np.testing.assert_allclose(absorbed, expanded, rtol=0, atol=1e-5)
