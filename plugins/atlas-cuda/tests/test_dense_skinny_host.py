"""Policy ``gemm=skinny``, host side (no GPU needed): which bf16 / f16 linears take
``qskinny_dense_*`` (quant_skinny.cu's variant for weights in the activation dtype) and with what
launch; the default policy never does. Numbers on a GPU: test_dense_skinny_cuda.py."""

import numpy as np
import pytest

from atlas_core.api import as_dtype
from atlas_cuda import ops_quant
from atlas_cuda.ops import DENSE_SKINNY_MAX_M, DenseOps
from atlas_cuda.ops_quant import skinny_splits
from atlas_cuda.policy import KernelPolicy, resolve, with_batch_invariance
from fake_context import FakeArray, fake_context

BF16 = as_dtype("bfloat16")
SKINNY = KernelPolicy(gemm="skinny")


class Arr(FakeArray):
    def __init__(self, shape, dtype=BF16, ptr=0):
        super().__init__(shape, dtype)
        self.size, self.ptr = int(np.prod(self.shape)), ptr


def _launch(policy, m, n=4096, k=4096, dtype=BF16, ptr=0):
    ctx = fake_context(policy)
    DenseOps(ctx).linear(Arr((m, k), dtype, ptr), Arr((n, k), dtype))
    (launch,) = ctx.kernels.launches
    return launch


@pytest.mark.parametrize("m, nt, depth", [(2, 1, 2), (8, 1, 2), (9, 2, 1), (16, 2, 1),
                                          (17, 4, 1), (32, 4, 1)])
def test_two_to_32_rows_take_the_dense_skinny_kernel(m, nt, depth):
    name, grid, shmem, args, pdl = _launch(SKINNY, m, n=6144, k=4096)
    assert name == f"qskinny_dense_bf16_n{nt}_d{depth}"
    s = skinny_splits(6144, 4096, 132)
    assert grid == -(-(6144 // 16) * s // 8) and args[-4:] == (m, 6144, 4096, s)
    assert pdl and shmem == 0


@pytest.mark.parametrize("case", ["one row", "33 rows", "K not a multiple of 128", "f32",
                                  "unaligned x", "default policy", "batch invariant"])
def test_everything_else_keeps_its_kernel(case):
    policy, m, k, dtype, ptr = SKINNY, 8, 4096, BF16, 0
    if case == "one row":
        m = 1
    elif case == "33 rows":
        m = DENSE_SKINNY_MAX_M + 1
    elif case == "K not a multiple of 128":
        k = 4160
    elif case == "f32":
        dtype = np.dtype(np.float32)
    elif case == "unaligned x":
        ptr = 8
    elif case == "default policy":
        policy = KernelPolicy()
    else:
        policy = with_batch_invariance(SKINNY)
    name, *_ = _launch(policy, m, k=k, dtype=dtype, ptr=ptr)
    assert not name.startswith("qskinny_dense"), name


def test_the_environment_asks_for_it():
    assert resolve({}, {}, {"ATLAS_CUDA_GEMM": "skinny"}).gemm == "skinny"
    assert with_batch_invariance(SKINNY).gemm == "mma"


@pytest.mark.parametrize("m, nt", [(4, 1), (12, 2), (30, 4)])
@pytest.mark.parametrize("depth", [3, 4])
def test_a_ring_configuration_takes_the_shared_memory_form(monkeypatch, m, nt, depth):
    monkeypatch.setitem(ops_quant.SKINNY2_CONFIG, ("dense", nt), (1, depth))
    name, grid, shmem, args, pdl = _launch(SKINNY, m, n=4096, k=12288)
    assert name == f"qskinny2_dense_bf16_n{nt}_m1_d{depth}"
    s = skinny_splits(4096, 12288, 132, 16)
    assert grid == -(-(4096 // 16) * s // 8) and args[-4:] == (m, 4096, 12288, s)
    # 8 warps x depth steps x 2 rows x four 16-byte chunks x 32 lanes
    assert shmem == max(8 * depth * 2 * 4 * 512, 8 * nt * 512 if s > 1 else 0) and pdl


@pytest.mark.parametrize("gemm, lt, says", [
    ("auto", object(), "cuBLASLt"), ("auto", None, "nvmath-python (cuBLASLt) is not installed"),
    ("mma", object(), "the own mma.sync GEMM (policy gemm=mma)"),
    ("skinny", object(), "2-32 rows on qskinny_dense")])
def test_the_bench_report_names_what_ran_the_matmuls(gemm, lt, says):
    from types import SimpleNamespace

    from atlas_cuda.backend import CudaBackend

    backend = SimpleNamespace(policy=KernelPolicy(gemm=gemm),
                              ctx=SimpleNamespace(cublaslt=lambda: lt))
    assert says in CudaBackend.matmul_library(backend)
