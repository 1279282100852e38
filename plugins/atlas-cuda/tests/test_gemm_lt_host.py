"""CublasLtGemm's host logic against a fake cuBLASLt binding (no GPU): layouts, transposes,
per-shape plan cache, fallback when the heuristic finds nothing."""

import ctypes
import sys
import types

import numpy as np
import pytest

pytest.importorskip("cuda.bindings")


class FakeLt(types.ModuleType):
    def __init__(self, algos=1):
        super().__init__("nvmath.bindings.cublasLt")
        self.calls, self.algos, self.next = [], algos, 100
        self.MatmulDescAttribute = types.SimpleNamespace(TRANSA=3, TRANSB=4, EPILOGUE=7,
                                                         BIAS_POINTER=8)
        self.MatmulPreferenceAttribute = types.SimpleNamespace(
            MAX_WORKSPACE_BYTES=1, **{f"MIN_ALIGNMENT_{w}_BYTES": 5 + i for i, w in enumerate("ABCD")})
        self.Epilogue = types.SimpleNamespace(BIAS=4)

        class Result:
            def __init__(self, n):
                self.ptr, self.state, self.workspace_size = 7, 0, 1024
        self.MatmulHeuristicResult = Result

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        return lambda *args: self._record(name, args)

    def _record(self, name, args):
        self.calls.append((name, args))
        if name == "matmul_algo_get_heuristic":  # writes the algorithm count through a pointer
            (ctypes.c_int32 * 1).from_address(args[-1])[0] = self.algos
        self.next += 1
        return self.next


@pytest.fixture
def gemm(monkeypatch):
    def make(algos=1):
        fake = FakeLt(algos)
        bindings = types.ModuleType("nvmath.bindings")
        bindings.cublasLt = fake
        monkeypatch.setitem(sys.modules, "nvmath", types.ModuleType("nvmath"))
        monkeypatch.setitem(sys.modules, "nvmath.bindings", bindings)
        monkeypatch.setitem(sys.modules, "nvmath.bindings.cublasLt", fake)
        from atlas_cuda import gemm_lt
        monkeypatch.setattr(gemm_lt, "DeviceAllocation", lambda n: types.SimpleNamespace(ptr=4096, nbytes=n))
        return gemm_lt.CublasLtGemm(stream=5), fake
    return make


def arr(ptr, shape):
    from atlas_cuda.array import DeviceArray
    from atlas_core.api import bfloat16
    return DeviceArray(ptr, shape, bfloat16)


def test_layouts_and_plan_cache(gemm):
    g, fake = gemm()
    y, x, w = arr(1 << 20, (32, 512)), arr(2 << 20, (32, 1024)), arr(3 << 20, (512, 1024))
    assert g(y, x, w, None, 32, 512, 1024)
    layouts = [a for n, a in fake.calls if n == "matrix_layout_create"]
    assert layouts == [(14, 1024, 512, 1024), (14, 1024, 32, 1024), (14, 512, 32, 512)]
    mm = [a for n, a in fake.calls if n == "matmul"]
    assert len(mm) == 1 and mm[0][3] == w.ptr and mm[0][5] == x.ptr and mm[0][10] == y.ptr
    assert mm[0][-1] == 5
    n_before = len(fake.calls)
    assert g(y, x, w, None, 32, 512, 1024)
    assert [n for n, _ in fake.calls[n_before:]] == ["matmul"]


def test_no_algorithm_falls_back(gemm):
    g, _ = gemm(algos=0)
    y, x, w = arr(1 << 20, (32, 512)), arr(2 << 20, (32, 1024)), arr(3 << 20, (512, 1024))
    assert not g(y, x, w, None, 32, 512, 1024)
