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


# --- policy gemm_tune: the fastest of the heuristic's candidates (atlas_cuda.gemm_tune) ---

class FakeTimer:
    """Returns the next of ``times`` per candidate (an Exception instance: that launch fails),
    after running the launch once, as GemmTimer does."""

    def __init__(self, times):
        self.times, self.runs = list(times), 0

    def median_ms(self, launch, reps=5):
        launch()
        self.runs += 1
        t = self.times.pop(0)
        if isinstance(t, Exception):
            raise t
        return t

    def close(self):
        self.closed = True


def _results(fake):
    """The heuristic's result array of the last request, as a view of HEURISTIC_DTYPE records."""
    from atlas_cuda.gemm_tune import HEURISTIC_DTYPE
    args = [a for n, a in fake.calls if n == "matmul_algo_get_heuristic"][-1]
    n, ptr = args[7], args[8]
    buf = (ctypes.c_uint8 * (n * HEURISTIC_DTYPE.itemsize)).from_address(ptr)
    return np.frombuffer(buf, HEURISTIC_DTYPE), args


def _last_algo(fake):
    return [a for n, a in fake.calls if n == "matmul"][-1][12]


def test_heuristic_record_is_the_c_struct():
    from atlas_cuda.gemm_tune import HEURISTIC_DTYPE
    # cublasLtMatmulHeuristicResult_t: 64-byte algo, size_t, status, float, int[4]
    assert HEURISTIC_DTYPE.itemsize == 96 and HEURISTIC_DTYPE.fields["algo"][1] == 0


def test_tuning_keeps_the_fastest_candidate(gemm, monkeypatch):
    from atlas_cuda import gemm_lt
    from atlas_cuda.gemm_tune import TUNE_CANDIDATES
    g, fake = gemm(algos=4)
    g.timer = FakeTimer([3.0, 1.5, RuntimeError("refused"), 2.0])
    y, x, w = arr(1 << 20, (8, 512)), arr(2 << 20, (8, 1024)), arr(3 << 20, (512, 1024))
    assert g(y, x, w, None, 8, 512, 1024, tune=True)
    results, args = _results(fake)
    assert args[7] == TUNE_CANDIDATES and g.timer.runs == 4
    # candidate 1 (1.5 ms) is enqueued for the call itself
    assert _last_algo(fake) == args[8] + 1 * results.itemsize
    # the shape is planned: the next calls only enqueue, tuned or not
    n_before = len(fake.calls)
    assert g(y, x, w, None, 8, 512, 1024, tune=True) and g(y, x, w, None, 8, 512, 1024)
    assert [n for n, _ in fake.calls[n_before:]] == ["matmul", "matmul"]
    assert gemm_lt.TUNE_MAX_ROWS >= 8


def test_tuning_skips_failed_states_and_keeps_the_first_when_all_fail(gemm):
    g, fake = gemm(algos=3)
    g.timer = FakeTimer([RuntimeError("a"), RuntimeError("b"), RuntimeError("c")])
    y, x, w = arr(1 << 20, (4, 512)), arr(2 << 20, (4, 1024)), arr(3 << 20, (512, 1024))
    assert g(y, x, w, None, 4, 512, 1024, tune=True)
    results, args = _results(fake)
    assert _last_algo(fake) == args[8]


def test_usable_and_pick_fastest():
    from atlas_cuda.gemm_tune import HEURISTIC_DTYPE, pick_fastest, usable
    r = np.zeros(4, HEURISTIC_DTYPE)
    r["state"][1] = 15                # not supported
    r["workspace_size"][2] = 1 << 40  # past the workspace
    assert usable(r, 4, 32 << 20) == [0, 3]
    assert usable(r, 1, 32 << 20) == [0]
    assert pick_fastest([2.0, None, 1.0, 1.0]) == 2
    assert pick_fastest([None, None]) is None


def test_no_tuning_without_the_flag_or_past_the_row_limit(gemm):
    from atlas_cuda.gemm_tune import TUNE_MAX_ROWS
    g, fake = gemm(algos=4)
    g.timer = FakeTimer([])
    y, x, w = arr(1 << 20, (8, 512)), arr(2 << 20, (8, 1024)), arr(3 << 20, (512, 1024))
    assert g(y, x, w, None, 8, 512, 1024)
    assert _results(fake)[1][7] == 1
    m = TUNE_MAX_ROWS + 1
    assert g(arr(1 << 20, (m, 512)), arr(2 << 20, (m, 1024)), w, None, m, 512, 1024, tune=True)
    assert _results(fake)[1][7] == 1 and g.timer.runs == 0


def test_an_untuned_shape_is_tuned_once_asked(gemm):
    g, fake = gemm(algos=2)
    g.timer = FakeTimer([2.0, 1.0])
    y, x, w = arr(1 << 20, (8, 512)), arr(2 << 20, (8, 1024)), arr(3 << 20, (512, 1024))
    assert g(y, x, w, None, 8, 512, 1024)  # planned under capture, say: the first candidate
    creates = sum(n == "matmul_desc_create" for n, _ in fake.calls)
    assert g(y, x, w, None, 8, 512, 1024, tune=True)
    results, args = _results(fake)
    assert args[7] > 1 and _last_algo(fake) == args[8] + results.itemsize
    # the descriptors are reused, not made again
    assert sum(n == "matmul_desc_create" for n, _ in fake.calls) == creates
    g.close()
    assert sum(n == "matmul_desc_destroy" for n, _ in fake.calls) == 1


def test_linear_asks_for_tuning_only_in_a_graph_probe_under_the_policy():
    """The eager call that precedes a capture (a decode graph's shapes) tunes; a served eager
    step (prefill chunks of any size) and the capture itself do not."""
    from atlas_cuda.ops import DenseOps
    from atlas_cuda.policy import KernelPolicy
    from fake_context import fake_context
    seen = []

    class Lt:
        def __call__(self, y, x, w, bias, M, N, K, tune=False):
            seen.append(tune)
            return True

    for on, probing, want in ((True, True, True), (True, False, False), (False, True, False)):
        ctx = fake_context(KernelPolicy(gemm_tune=on))
        ctx.cublaslt = lambda: Lt()
        ctx.backend._probing = probing
        DenseOps(ctx).linear(arr(1 << 20, (16, 1024)), arr(2 << 20, (512, 1024)))
        assert seen[-1] is want


def test_gemm_timer_flushes_l2_before_each_timed_run(monkeypatch):
    from atlas_cuda import gemm_tune
    calls = []

    class Drv:
        def __getattr__(self, name):
            def f(*args):
                calls.append(name)
                if name == "cuEventCreate":
                    return (0, len(calls))
                if name == "cuEventElapsedTime":  # 3, 1, 2 ms: the median is 2
                    return (0, (3.0, 1.0, 2.0)[calls.count(name) - 1])
                return (0,)
            return f

    monkeypatch.setattr(gemm_tune, "drv", lambda: Drv())
    monkeypatch.setattr(gemm_tune, "check", lambda r: r[1] if len(r) > 1 else None)
    for fails in (False, True):
        def alloc(n):
            if fails:
                raise MemoryError("full")
            return types.SimpleNamespace(ptr=64, nbytes=n)
        monkeypatch.setattr(gemm_tune, "DeviceAllocation", alloc)
        calls.clear()
        timer = gemm_tune.GemmTimer(stream=5)
        ms = timer.median_ms(lambda: calls.append("launch"), reps=3)
        timed = calls[calls.index("launch") + 1:]
        runs = [c for c in timed if c in ("cuMemsetD32Async", "cuEventRecord", "launch")]
        one = ["cuEventRecord", "launch", "cuEventRecord"]
        assert runs == (one * 3 if fails else (["cuMemsetD32Async"] + one) * 3)
        assert "cuStreamSynchronize" in timed and ms == 2.0
        timer.close()
        assert calls.count("cuEventDestroy") == 6
