"""Which kernels a decode MoE block's experts launch, with which grids (no GPU needed: a fake
backend records the launches). The numerics of every path are tested on the GPU in
test_moe_cuda.py."""

import numpy as np
import pytest

from atlas_core.ops._dtypes import bfloat16
from atlas_cuda.ops_moe import MoeOps


class _Arr:
    def __init__(self, shape, dtype):
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)


class _Kernel:
    def __init__(self, name):
        self.name = name
        self.occupancy = self

    def max_active_blocks_per_multiprocessor(self, block, shmem):
        return 1 if "_w4_" in self.name else 2


class _Backend:
    num_sms, _capturing = 132, False

    def __init__(self):
        self.launches = []
        self.kernels = self
        self.device = type("D", (), {"device_id": 0})()

    def kernel(self, module, variant, name, *_):
        return _Kernel(name)

    def launch(self, kernel, grid, block, *args, shmem=0, pdl=False):
        self.launches.append((kernel.name, grid, shmem, args))

    def zeros(self, shape, dtype):
        return np.zeros(shape, dtype)


class _Ops(MoeOps):
    _pdl = True

    def __init__(self):
        self.be = _Backend()
        self._experts1_occupancy = {}

    def _out(self, shape, dtype):
        return _Arr(shape, dtype)


def _plan(monkeypatch, mode, t, experts, inter, shared, suffix):
    monkeypatch.setenv("ATLAS_CUDA_MOE_EXPERTS1", mode)
    monkeypatch.delenv("ATLAS_CUDA_MOE_DOWN_WIDE", raising=False)
    ops, hidden = _Ops(), 2048
    wsg = _Arr((2 * shared, hidden), bfloat16) if shared else None
    wsd = _Arr((hidden, shared), bfloat16) if shared else None
    out = ops._mb_experts(_Arr((t, hidden), bfloat16), _Arr((t, experts), bfloat16), experts,
                          _Arr((experts, 2 * inter, hidden), bfloat16),
                          _Arr((experts, hidden, inter), bfloat16), wsg, wsd, 8, 1, 0, 0, suffix)
    assert out.shape == (t, hidden)
    return [(name, grid, shmem) for name, grid, shmem, _ in ops.be.launches]


@pytest.mark.parametrize("mode,t,inter,shared,want", [
    # qwen3-30b-a3b, one token: the one persistent kernel, a block per 8 hidden rows (<= 2 a SM)
    ("auto", 1, 768, 0, [("moe_experts1_t_w3_bf16", 256, 4 * 8 * 768)]),
    # wider experts hold more registers: one block a SM, so fewer warps than hidden rows
    ("auto", 1, 1024, 0, [("moe_experts1_t_w4_bf16", 132, 4 * 8 * 1024)]),
    ("0", 1, 768, 0, [("mb_gate_up_t_c4_bf16", (96, 8), 0), ("mb_down_t_w3_bf16", (256, 1), 0)]),
    # several tokens: the two kernels, the down kernel's chunk loop
    ("1", 2, 768, 0, [("mb_gate_up_t_c4_bf16", (96, 16), 0), ("mb_down_t_w0_bf16", (256, 2), 0)]),
    # a shared expert (qwen3.5-35b-a3b): the one kernel too, unless turned off
    ("auto", 1, 512, 512, [("moe_experts1_t_w2_bf16", 256, 4 * (8 * 512 + 512))]),
    ("1", 1, 512, 512, [("moe_experts1_t_w2_bf16", 256, 4 * (8 * 512 + 512))]),
    ("0", 1, 512, 512, [("mb_gate_up_t_c4_bf16", (64, 9), 0), ("mb_down_t_w2_bf16", (256, 1), 0)]),
])
def test_expert_kernels(monkeypatch, mode, t, inter, shared, want):
    assert _plan(monkeypatch, mode, t, 128, inter, shared, "_t") == want


def test_counter_slots_turn_and_stay_zeroed():
    ops = _Ops()
    first = ops._moe_counter(barrier=True)  # moe_experts1's 64-bit barrier count: 8-byte aligned
    assert first.shape == (2,) and not first.any()
    assert (first.__array_interface__["data"][0] - ops._moe_counters.__array_interface__["data"][0]) % 8 == 0
    slots = [ops._moe_counter() for _ in range(63)]
    assert all(s.shape == (1,) for s in slots)
    assert np.shares_memory(ops._moe_counter(barrier=True), first)  # the 65th call reuses the first slot
    # a router counter never shares memory with any call's barrier count
    assert not any(np.shares_memory(a, b) for a, b in zip(slots, slots[1:]))
    assert not any(np.shares_memory(s, first) for s in slots)


def test_experts1_arguments_follow_the_kernel_signature(monkeypatch):
    # moe_experts1[_t]_w<NC>(out, h, hs, x, wgu, wd, wsgu, wsd, logits, sync, k, E, rows,
    # renorm, sig, H, I, Is, gelu, overlap)
    monkeypatch.setenv("ATLAS_CUDA_MOE_EXPERTS1", "auto")
    monkeypatch.setenv("ATLAS_CUDA_MOE_EXPERTS1_OVERLAP", "0")
    ops, hidden = _Ops(), 2048
    wgu, wd = _Arr((256, 1024, hidden), bfloat16), _Arr((256, hidden, 512), bfloat16)
    wsg, wsd = _Arr((1024, hidden), bfloat16), _Arr((hidden, 512), bfloat16)
    x, logits = _Arr((1, hidden), bfloat16), _Arr((1, 257), np.float32)
    ops._mb_experts(x, logits, 257, wgu, wd, wsg, wsd, 8, 1, 0, 0, "")
    (name, _, _, args), = ops.be.launches
    assert name == "moe_experts1_w2_bf16" and len(args) == 20
    assert args[3] is x and args[4] is wgu and args[5] is wd and args[6] is wsg
    assert args[7] is wsd and args[8] is logits
    assert args[9].shape == (2,) and np.shares_memory(args[9], ops._moe_counters)
    assert args[10:] == (8, 256, 257, 1, 0, hidden, 512, 512, 0, 0)


def test_router_stack_copies_once_and_refuses_capture():
    # [router; shared_gate] as one [E + 1, H] matrix for the router GEMV: built on the first
    # call with two device copies, reused after, never built inside a graph capture
    from atlas_cuda.array import DeviceArray

    copies, allocs = [], []

    class Be(_Backend):
        def empty(self, shape, dtype):
            allocs.append(shape)
            return DeviceArray(1 << 20, shape, dtype)

        def copy_(self, dst, src):
            copies.append((dst.ptr, dst.shape, src.ptr))

    ops = _Ops()
    ops.be = Be()
    router = DeviceArray(1 << 30, (256, 2048), bfloat16)
    gate = DeviceArray(1 << 31, (1, 2048), bfloat16)
    stacked = ops._router_stack(router, gate)
    assert stacked.shape == (257, 2048) and allocs == [(257, 2048)]
    assert copies == [(1 << 20, (256, 2048), 1 << 30), ((1 << 20) + 256 * 2048 * 2, (1, 2048), 1 << 31)]
    assert ops._router_stack(router, gate) is stacked and len(copies) == 2
    ops.be._capturing = True
    with pytest.raises(RuntimeError, match="eagerly"):
        ops._router_stack(DeviceArray(1 << 32, (256, 2048), bfloat16), gate)


@pytest.mark.parametrize("router", ["gemv", "block"])
def test_shared_expert_block_router(monkeypatch, router):
    # one token of a shared-expert block (qwen3.5-35b-a3b): `gemv` runs the fused norm + router
    # GEMV over [router; shared_gate], then moe_experts1 on its logits in the activation dtype;
    # `block` runs mb_router (float logits), then moe_experts1
    from atlas_cuda.array import DeviceArray

    monkeypatch.setenv("ATLAS_CUDA_MOE_ROUTER", router)
    monkeypatch.setenv("ATLAS_CUDA_MOE_EXPERTS1", "auto")
    gemv_weights = []

    class Be(_Backend):
        def empty(self, shape, dtype):
            return DeviceArray(1 << 20, shape, dtype)

        def copy_(self, dst, src):
            pass

    class Ops(_Ops):
        def _moe_grouped(self, *_):  # CudaOps': the grouped GEMM serves many pairs, not one token
            return False

        def _norm_gemv_fusable(self, *_):
            return True

        def _norm_gemv(self, x, residual, norm_weight, eps, weight, *_, normed=False):
            gemv_weights.append(weight.shape)
            return _Arr((1, weight.shape[0]), x.dtype), _Arr(x.shape, x.dtype), x

    ops, hidden = Ops(), 2048
    ops.be = Be()
    arr = lambda shape, i: DeviceArray(i << 24, shape, bfloat16)  # noqa: E731
    x, res, nw = arr((1, hidden), 1), arr((1, hidden), 2), arr((hidden,), 3)
    out, _ = ops.rms_norm_moe_block(
        x, res, nw, 1e-6, True, arr((256, hidden), 4), arr((256, 1024, hidden), 5),
        arr((256, hidden, 512), 6), 8, True, shared_gate_up=arr((1024, hidden), 7),
        shared_down=arr((hidden, 512), 8), shared_gate=arr((1, hidden), 9))
    names = [name for name, *_ in ops.be.launches]
    if router == "gemv":
        assert gemv_weights == [(257, hidden)] and names == ["moe_experts1_t_w2_bf16"]
    else:
        assert gemv_weights == [] and names == ["mb_router_bf16", "moe_experts1_w2_bf16"]
    assert ops.be.launches[-1][3][12] == 257  # rows: 256 experts + the shared gate
