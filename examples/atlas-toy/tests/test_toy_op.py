"""The toy plugin's own op, ``toy_softcap``: registered, contract-tested, compiled, run on CUDA.

Nothing here (and nothing in atlas-core or atlas-cuda) names the op except the plugin: the
contract cases come from its spec, the CUDA source folder from its ``register_kernel_sources``.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from atlas_core.api import OpRegistry, Registry
from atlas_core.testing.contracts_cases import check_case, registered_cases
from atlas_toy.cuda import kernel_dir
from atlas_toy.softcap import toy_softcap, toy_softcap_numpy

OP = "toy_softcap"
TARGETS = ("sm_90a", "sm_121")


@pytest.fixture(scope="module")
def ops():
    return OpRegistry(Registry())


@functools.cache
def _cases(ops):
    return tuple(case for name, case in registered_cases(ops) if name == OP)


def test_the_plugin_registers_the_op_its_implementations_and_its_kernels(ops):
    assert ops.owner(OP) == "toy"
    assert ops.reference(OP) is toy_softcap
    assert ops.backends(OP) == ["cuda", "numpy"]
    assert kernel_dir() in ops.kernel_source_dirs()
    assert (kernel_dir() / f"{OP}.cu").is_file()
    assert len(_cases(ops)) == 6


@pytest.mark.parametrize("backend_name", ["numpy", "mock"])
def test_the_generated_contract_cases_pass(ops, backend_name):
    backend = ops.registry.create("gpu_backends", backend_name, op_registry=ops)
    for case in _cases(ops):
        check_case(backend, ops, OP, case)


def test_numpy_runs_the_plugins_implementation_and_mock_records_it(ops):
    numpy_backend = ops.registry.create("gpu_backends", "numpy", op_registry=ops)
    assert numpy_backend.ops.toy_softcap is toy_softcap_numpy
    mock = ops.registry.create("gpu_backends", "mock", op_registry=ops)
    x = mock.from_host(np.linspace(-9, 9, 16, dtype=np.float32))
    with mock.record() as rec:
        mock.ops.toy_softcap(x, 3.0)
    assert rec.names("launch") == [OP]


def test_a_wrong_implementation_fails_the_contract(ops):
    backend = ops.registry.create("gpu_backends", "numpy", op_registry=ops)
    backend.ops.toy_softcap = lambda x, cap: np.clip(x, -cap, cap)
    with pytest.raises(AssertionError, match="relative error"):
        for case in _cases(ops):
            check_case(backend, ops, OP, case)


def test_the_reference_saturates_at_the_cap_and_refuses_a_bad_one():
    x = np.array([-1e4, -1.0, 0.0, 1e-3, 1e4], np.float32)
    out = toy_softcap(x, 5.0)
    np.testing.assert_allclose(out, [-5.0, 5 * np.tanh(-0.2), 0.0, 1e-3, 5.0], rtol=1e-6)
    with pytest.raises(ValueError, match="cap must be positive"):
        toy_softcap_numpy(x, 0.0)


@pytest.mark.parametrize("arch", TARGETS)
def test_the_kernel_compiles_for_hopper_and_gb10(arch):
    pytest.importorskip("cuda.core")
    compiler = pytest.importorskip("atlas_cuda.compiler")
    from atlas_cuda.targets import generic_kernel_dir

    sources = compiler.KernelSources([kernel_dir(), generic_kernel_dir() / "common"])
    assert sources.variants(OP) == ["bf16", "f16", "f32"]
    for variant in ("bf16", "f32"):
        assert compiler.compile_module(sources, OP, variant, arch, None)


def _has_cuda_device() -> bool:
    try:
        from cuda.bindings import driver
        if driver.cuInit(0)[0] != driver.CUresult.CUDA_SUCCESS:
            return False
        err, count = driver.cuDeviceGetCount()
        return err == driver.CUresult.CUDA_SUCCESS and count > 0
    except Exception:  # noqa: BLE001 - no cuda-python, no driver library: no device
        return False


@pytest.mark.gpu
def test_the_cuda_backend_runs_the_plugins_kernel(ops):
    if not _has_cuda_device():
        pytest.skip("no CUDA device")
    backend = ops.registry.create("gpu_backends", "cuda", op_registry=ops)
    try:
        for case in _cases(ops):
            check_case(backend, ops, OP, case)
    finally:
        backend.close()
