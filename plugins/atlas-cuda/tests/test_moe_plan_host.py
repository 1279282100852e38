"""Which kernels a decode MoE block's experts launch, with which grids (no GPU needed: a fake
backend records the launches). The numerics of every path are tested on the GPU in
test_moe_cuda.py."""

import numpy as np
import pytest

from atlas_core.api import bfloat16
from atlas_cuda.ops_moe import MoeOps
from fake_context import FakeArray as _Arr
from fake_context import FakeBackend, fake_context


def _ops():
    return MoeOps(fake_context())


def _launches(ops):
    return ops.ctx.kernels.launches


def _plan(t, experts, inter, shared, suffix):
    ops, hidden = _ops(), 2048
    wsg = _Arr((2 * shared, hidden), bfloat16) if shared else None
    wsd = _Arr((hidden, shared), bfloat16) if shared else None
    out = ops._mb_experts(_Arr((t, hidden), bfloat16), _Arr((t, experts), bfloat16), experts,
                          _Arr((experts, 2 * inter, hidden), bfloat16),
                          _Arr((experts, hidden, inter), bfloat16), wsg, wsd, 8, 1, 0, 0, suffix)
    assert out.shape == (t, hidden)
    return [(name, grid, shmem) for name, grid, shmem, *_ in _launches(ops)]


@pytest.mark.parametrize("t,experts,inter,shared,want", [
    # qwen3-30b-a3b, one token: the one persistent kernel, a block per 8 hidden rows (<= 2 a SM)
    (1, 128, 768, 0, [("moe_experts1_t_w3_bf16", 256, 4 * 8 * 768)]),
    # wider experts hold more registers: one block a SM, so fewer warps than hidden rows
    (1, 128, 1024, 0, [("moe_experts1_t_w4_bf16", 132, 4 * 8 * 1024)]),
    # several tokens: the two kernels, the down kernel's chunk loop
    (2, 128, 768, 0, [("mb_gate_up_t_c4_bf16", (96, 16), 0), ("mb_down_t_w0_bf16", (256, 2), 0)]),
    # a shared expert (qwen3.5-35b-a3b): the one kernel too
    (1, 128, 512, 512, [("moe_experts1_t_w2_bf16", 256, 4 * (8 * 512 + 512))]),
    # experts wider than 1,024: the two kernels, the one-token down kernel's wide loads off
    (1, 128, 1536, 0, [("mb_gate_up_t_c4_bf16", (192, 8), 0), ("mb_down_t_w0_bf16", (256, 1), 0)]),
    # more than 256 experts: the two kernels, the wide down loads
    (1, 512, 768, 0, [("mb_gate_up_t_c4_bf16", (96, 8), 0), ("mb_down_t_w3_bf16", (256, 1), 0)]),
])
def test_expert_kernels(t, experts, inter, shared, want):
    assert _plan(t, experts, inter, shared, "_t") == want


def test_counter_slots_turn_and_stay_zeroed():
    ops = _ops()
    first = ops._moe_counter(barrier=True)  # moe_experts1's 64-bit barrier count: 8-byte aligned
    assert first.shape == (2,) and not first.any()
    assert (first.__array_interface__["data"][0] - ops._moe_counters.__array_interface__["data"][0]) % 8 == 0
    slots = [ops._moe_counter() for _ in range(63)]
    assert all(s.shape == (1,) for s in slots)
    assert np.shares_memory(ops._moe_counter(barrier=True), first)  # the 65th call reuses the first slot
    # a router counter never shares memory with any call's barrier count
    assert not any(np.shares_memory(a, b) for a, b in zip(slots, slots[1:]))
    assert not any(np.shares_memory(s, first) for s in slots)


def test_experts1_arguments_follow_the_kernel_signature():
    # moe_experts1[_t]_w<NC>(out, h, hs, x, wgu, wd, wsgu, wsd, logits, sync, k, E, rows,
    # renorm, sig, H, I, Is, gelu, overlap): the selection always overlapped with the loads
    ops, hidden = _ops(), 2048
    wgu, wd = _Arr((256, 1024, hidden), bfloat16), _Arr((256, hidden, 512), bfloat16)
    wsg, wsd = _Arr((1024, hidden), bfloat16), _Arr((hidden, 512), bfloat16)
    x, logits = _Arr((1, hidden), bfloat16), _Arr((1, 257), np.float32)
    ops._mb_experts(x, logits, 257, wgu, wd, wsg, wsd, 8, 1, 0, 0, "")
    (name, _, _, args, pdl), = _launches(ops)
    assert name == "moe_experts1_w2_bf16" and len(args) == 20 and pdl
    assert args[3] is x and args[4] is wgu and args[5] is wd and args[6] is wsg
    assert args[7] is wsd and args[8] is logits
    assert args[9].shape == (2,) and np.shares_memory(args[9], ops._moe_counters)
    assert args[10:] == (8, 256, 257, 1, 0, hidden, 512, 512, 0, 1)


class _CopyBackend(FakeBackend):
    """Records the router stack's allocation and device copies."""

    def __init__(self):
        super().__init__()
        self.allocs, self.copies = [], []

    def empty(self, shape, dtype):
        from atlas_cuda.array import DeviceArray
        self.allocs.append(shape)
        return DeviceArray(1 << 20, shape, dtype)

    def copy_(self, dst, src):
        self.copies.append((dst.ptr, dst.shape, src.ptr))


def test_router_stack_copies_once_and_refuses_capture():
    # [router; shared_gate] as one [E + 1, H] matrix for the router GEMV: built on the first
    # call with two device copies, reused after, never built inside a graph capture
    from atlas_cuda.array import DeviceArray

    be = _CopyBackend()
    ops = MoeOps(fake_context(backend=be))
    router = DeviceArray(1 << 30, (256, 2048), bfloat16)
    gate = DeviceArray(1 << 31, (1, 2048), bfloat16)
    stacked = ops._router_stack(router, gate)
    assert stacked.shape == (257, 2048) and be.allocs == [(257, 2048)]
    assert be.copies == [(1 << 20, (256, 2048), 1 << 30),
                         ((1 << 20) + 256 * 2048 * 2, (1, 2048), 1 << 31)]
    assert ops._router_stack(router, gate) is stacked and len(be.copies) == 2
    be._capturing = True
    with pytest.raises(RuntimeError, match="eagerly"):
        ops._router_stack(DeviceArray(1 << 32, (256, 2048), bfloat16), gate)


class _RouterGemv:
    """GemvOps stand-in: the fused norm GEMV serves, and records the matrices it multiplies."""

    def __init__(self):
        self.weights = []

    def norm_gemv_fusable(self, *_):
        return True

    def norm_gemv(self, x, residual, norm_weight, eps, weight, *_, normed=False):
        self.weights.append(weight.shape)
        return _Arr((1, weight.shape[0]), x.dtype), _Arr(x.shape, x.dtype), x


def test_shared_expert_block_router():
    # one token of a shared-expert block (qwen3.5-35b-a3b): the fused norm + router GEMV over
    # [router; shared_gate], then moe_experts1 on its logits in the activation dtype (the
    # mb_router alternative measured slower: 35B 382.6 -> 418.5 tok/s, and was removed)
    from atlas_cuda.array import DeviceArray

    ops, hidden = MoeOps(fake_context(backend=_CopyBackend())), 2048
    ops.gemv = _RouterGemv()
    arr = lambda shape, i: DeviceArray(i << 24, shape, bfloat16)  # noqa: E731
    x, res, nw = arr((1, hidden), 1), arr((1, hidden), 2), arr((hidden,), 3)
    out, _ = ops.rms_norm_moe_block(
        x, res, nw, 1e-6, True, arr((256, hidden), 4), arr((256, 1024, hidden), 5),
        arr((256, hidden, 512), 6), 8, True, shared_gate_up=arr((1024, hidden), 7),
        shared_down=arr((hidden, 512), 8), shared_gate=arr((1, hidden), 9))
    names = [name for name, *_ in _launches(ops)]
    assert ops.gemv.weights == [(257, hidden)] and names == ["moe_experts1_t_w2_bf16"]
    assert _launches(ops)[-1][3][12] == 257  # rows: 256 experts + the shared gate


@pytest.mark.parametrize("fused,want", [
    ("auto", ["moe_experts1_t_w2_bf16"]),
    # policy moe_fused=0: router linear, moe_route, moe_experts, the shared expert one by one
    ("0", None),
])
def test_moe_fused_policy_is_read_from_the_context(fused, want):
    from atlas_cuda.array import DeviceArray
    from atlas_cuda.policy import KernelPolicy

    ops, hidden = MoeOps(fake_context(KernelPolicy(moe_fused=fused), _CopyBackend())), 2048
    ops.gemv = _RouterGemv()
    composed = []
    ops.ctx.ops = type("Table", (), {"__getattr__": lambda self, name: composed.append(name)})()
    arr = lambda shape, i: DeviceArray(i << 24, shape, bfloat16)  # noqa: E731
    args = (arr((1, hidden), 1), arr((1, hidden), 2), arr((hidden,), 3), 1e-6, True,
            arr((256, hidden), 4), arr((256, 1024, hidden), 5), arr((256, hidden, 512), 6), 8,
            True)
    shared = dict(shared_gate_up=arr((1024, hidden), 7), shared_down=arr((hidden, 512), 8),
                  shared_gate=arr((1, hidden), 9))
    if want is None:
        with pytest.raises(TypeError):
            ops.rms_norm_moe_block(*args, **shared)
        assert composed and _launches(ops) == []
    else:
        ops.rms_norm_moe_block(*args, **shared)
        assert [name for name, *_ in _launches(ops)] == want and not composed


@pytest.mark.parametrize("mode,hidden,inter,want", [
    # auto: rows where it applies (h within its shared-memory budget)
    ("auto", 2048, 768, "moe_dec_down_rows_bf16"),  # qwen3-30b-a3b
    ("auto", 2816, 704, "moe_dec_down_rows_bf16"),  # gemma-4-26b-a4b
    ("auto", 3072, 1536, "moe_dec_down_rows_bf16"),  # minimax-m2
    # else the wide kernel where its ceil(hidden / 8) blocks are resident at once (the fake
    # kernels: two blocks an SM, one for _w4; 132 SMs)
    # (I = 764: not a multiple of 8, so no rows)
    ("auto", 2048, 764, "moe_dec_down_w3_bf16"),    # 256 blocks <= 264
    ("auto", 2816, 764, "moe_dec_down_bf16"),       # 352 blocks, 1.33 waves
    ("auto", 2048, 1020, "moe_dec_down_bf16"),      # _w4: 256 blocks > 132
    ("auto", 2048, 3080, "moe_dec_down_bf16"),      # h past the budget, more than 4 chunks
    ("wide", 2816, 704, "moe_dec_down_w3_bf16"),
    ("plain", 2048, 768, "moe_dec_down_bf16"),
    ("rows", 2816, 704, "moe_dec_down_rows_bf16"),
    ("rows", 3072, 1536, "moe_dec_down_rows_bf16"),
    ("rows", 2048, 4096, "moe_dec_down_bf16"),     # h past the shared-memory budget
    ("rows", 2048, 100, "moe_dec_down_bf16"),      # I not a multiple of 8
])
def test_moe_down_kernel_follows_the_policy_and_the_wave(mode, hidden, inter, want):
    from atlas_cuda.policy import KernelPolicy
    from atlas_cuda.ops_moe_decode import MoeDecodeOps
    ops = MoeDecodeOps(fake_context(KernelPolicy(moe_down=mode)))
    assert ops.down_kernel(1, 8, inter, hidden, "bf16") == want
    assert ops.down_kernel(2, 8, inter, hidden, "bf16") == "moe_dec_down_bf16"


def test_moe_down_rows_only_in_two_byte_dtypes_and_with_a_staged_shared_expert():
    from atlas_cuda.policy import KernelPolicy
    from atlas_cuda.ops_moe_decode import MoeDecodeOps
    ops = MoeDecodeOps(fake_context(KernelPolicy(moe_down="rows")))
    assert ops.down_kernel(1, 8, 704, 2816, "f16") == "moe_dec_down_rows_f16"
    assert ops.down_kernel(1, 8, 704, 2816, "f32") == "moe_dec_down_f32"  # f32 would spill
    assert ops.down_kernel(1, 8, 512, 2048, "bf16", 512) == "moe_dec_down_rows_bf16"
    assert ops.down_kernel(1, 8, 512, 2048, "bf16", 100) == "moe_dec_down_bf16"
    assert ops.down_kernel(1, 9, 512, 2048, "bf16") == "moe_dec_down_bf16"
