"""The step workspace's marks and the layer scope (no GPU needed: fake device allocations)."""

import itertools

import numpy as np
import pytest

from atlas_cuda import memory
from atlas_cuda.memory import LayerScope, Workspace

MB = 1 << 20


class FakeAllocation:
    made: list = []
    _next = itertools.count(1)

    def __init__(self, nbytes):
        self.nbytes = nbytes
        self.ptr = next(self._next) << 40  # far apart: chunks never overlap
        FakeAllocation.made.append(self)


@pytest.fixture(autouse=True)
def fake_device(monkeypatch):
    FakeAllocation.made = []
    monkeypatch.setattr(memory, "DeviceAllocation", FakeAllocation)


class FakeBackend:
    def __init__(self, nbytes):
        self.workspace = Workspace(nbytes)
        self.copies = []

    def copy_(self, dst, src):
        assert dst.nbytes == src.nbytes
        # the slot being written never overlaps the array copied into it
        assert dst.ptr + dst.nbytes <= src.ptr or src.ptr + src.nbytes <= dst.ptr
        self.copies.append((dst.ptr, src.ptr))


def test_rewind_hands_the_same_addresses_out_again():
    ws = Workspace(4 * MB)
    ws.alloc((MB,), np.uint8)
    m = ws.mark()
    a = ws.alloc((1000,), np.float32)
    ws.rewind(m)
    b = ws.alloc((1000,), np.float32)
    assert a.ptr == b.ptr


def test_chunks_added_after_a_mark_are_reused_before_new_ones():
    ws = Workspace(4 * MB)
    m = ws.mark()
    for _ in range(3):
        ws.rewind(m)
        for _ in range(6):  # 6 MB: one chunk added the first time, reused after
            ws.alloc((MB,), np.uint8)
    assert len(FakeAllocation.made) == 2 and ws.peak == 6 * MB  # 4 MB in chunk 1, 2 in chunk 2
    ws.reset()
    assert len(ws.chunks) == 1 and ws.chunk.nbytes == 8 * MB


def test_full_graph_workspace_raises():
    ws = Workspace(MB, growable=False)
    with pytest.raises(memory.WorkspaceFull):
        ws.alloc((2 * MB,), np.uint8)


def test_layer_scope_keeps_the_workspace_to_one_layer():
    be = FakeBackend(64 * MB)
    hidden = be.workspace.alloc((MB // 2,), np.float16)  # 1 MB: the embedding output
    residual = None
    scope = LayerScope(be, 2 * hidden.nbytes)
    slots = {s.ptr for s in scope.slots}
    for i in range(40):  # 40 layers of 8 MB of op outputs each: 320 MB without the scope
        outs = [be.workspace.alloc((MB,), np.uint8) for _ in range(8)]
        new_hidden = memory.DeviceArray(outs[-1].ptr, (MB // 2,), np.float16, outs[-1].owner)
        # odd layers pass their residual through unchanged (it sits in the last carry's slot)
        residual = residual if (i % 2 and residual is not None) else new_hidden
        hidden, residual = scope.carry(new_hidden, residual)
        assert hidden.ptr in slots and hidden.ptr == scope.slots[i % 2].ptr
        assert residual.ptr == hidden.ptr + MB
    assert len(FakeAllocation.made) == 1 and be.workspace.peak <= 16 * MB
    assert len(be.copies) == 80


def test_layer_scope_leaves_arrays_larger_than_its_slot():
    be = FakeBackend(64 * MB)
    scope = LayerScope(be, MB)
    big = be.workspace.alloc((2 * MB,), np.uint8)
    mark = be.workspace.mark()
    assert scope.carry(big, None) == (big, None)
    assert be.workspace.mark() == mark and not be.copies



def _grown():
    ws = Workspace(4 * MB)
    ws.alloc((3 * MB,), np.uint8)
    ws.alloc((6 * MB,), np.uint8)  # does not fit the first chunk: a second one
    assert [c.nbytes for c in ws.chunks] == [4 * MB, 6 * MB]
    return ws


def test_reset_lets_the_old_chunks_go_before_taking_their_sum(monkeypatch):
    # gemma-4 on the H200: merging a grown arena held the old chunks and the merged one at once.
    ws, held = _grown(), []

    class Probe(FakeAllocation):
        def __init__(self, nbytes):
            held.append(list(ws.chunks))  # what the workspace still holds at that moment
            super().__init__(nbytes)

    monkeypatch.setattr(memory, "DeviceAllocation", Probe)
    ws.reset()
    assert held == [[]] and [c.nbytes for c in ws.chunks] == [10 * MB]


def test_reset_without_room_for_the_sum_keeps_the_first_size_and_grows_again(monkeypatch):
    ws = _grown()

    class Short(FakeAllocation):
        def __init__(self, nbytes):
            if nbytes > 4 * MB:
                raise memory.CudaError("CUDA driver error CUDA_ERROR_OUT_OF_MEMORY")
            super().__init__(nbytes)

    monkeypatch.setattr(memory, "DeviceAllocation", Short)
    ws.reset()
    assert [c.nbytes for c in ws.chunks] == [4 * MB]
    assert ws.alloc((MB,), np.uint8).ptr == ws.chunk.ptr
