"""The mock backend passes the GpuBackend contract and records what a GPU would be asked to do."""

import numpy as np
import pytest

from atlas_core.backends.mock_backend import MockGpuBackend
from atlas_core.plugins import Registry
from atlas_core.testing.contracts import GpuBackendContract


class TestMockBackend(GpuBackendContract):
    backend_name = "mock"


@pytest.fixture
def backend():
    return MockGpuBackend()


def test_registered_as_mock():
    assert isinstance(Registry().create("gpu_backends", "mock"), MockGpuBackend)


def test_allocations_copies_and_syncs(backend):
    host = np.ones((4, 8), np.float32)
    with backend.record() as rec:
        a = backend.from_host(host)
        b = backend.empty((4, 8), np.float32)
        backend.zeros((2,), np.int32)
        backend.copy_from_host(b, host)
        backend.copy_(b, a)
        backend.to_host(b)
        backend.synchronize()
    assert rec.count("alloc") == 3 and rec.names("alloc") == ["from_host", "empty", "zeros"]
    assert rec.bytes("alloc") == 128 + 128 + 8
    assert rec.count("h2d") == 2 and rec.bytes("h2d") == 256
    assert rec.bytes("d2d") == 128 and rec.bytes("d2h") == 128
    assert rec.count("sync") == 1 and rec.host_syncs == 2
    assert backend.count("alloc") == 3


def test_op_outputs_are_workspace_not_allocations(backend):
    x = backend.from_host(np.ones((3, 4), np.float32))
    w = backend.from_host(np.ones((5, 4), np.float32))
    with backend.record() as rec:
        backend.reset_workspace()
        y = backend.ops.linear(x, w)
        backend.ops.rms_norm(y, backend.ops.add(y, y)[0], 1e-6)
    assert rec.names("launch") == ["linear", "add", "rms_norm"]
    assert rec.count("alloc") == 0 and rec.count("reset_workspace") == 1
    assert rec.bytes("workspace") == 3 * 5 * 4 * 3


def test_graph_capture_and_replay_counts(backend):
    x = backend.from_host(np.ones((2, 4), np.float32))
    out = backend.zeros((2, 4), np.float32)

    def step():
        backend.copy_(out, backend.ops.add(x, x))

    with backend.record() as rec:
        graph = backend.capture(step)
    assert graph.ops == ["add"] and rec.count("capture") == 1 and rec.count("launch") == 0
    backend.copy_from_host(x, np.full((2, 4), 2, np.float32))
    with backend.record() as rec:
        for _ in range(3):
            graph.replay()
    assert rec.count("graph_launch") == 3 and rec.count("launch") == 0
    assert rec.count("graph_node", "add") == 3
    np.testing.assert_array_equal(backend.to_host(out), 4.0)


def test_decode_discipline_example(backend):
    """The pattern from MockGpuBackend's docstring: no allocation, one host sync per step."""
    ids = backend.zeros((4,), np.int32)
    table = backend.from_host(np.random.default_rng(0).standard_normal((16, 8)).astype(np.float32))
    graph = backend.capture(lambda: backend.ops.argmax(backend.ops.linear(
        backend.ops.embedding(ids, table), table)))
    with backend.record() as rec:
        backend.reset_workspace()
        backend.copy_from_host(ids, np.arange(4, dtype=np.int32))
        graph.replay()
        backend.to_host(ids)
    assert rec.count("alloc") == 0
    assert rec.host_syncs == 1
    assert rec.count("graph_launch") == 1 and rec.count("launch") == 0


def test_sync_inside_capture_is_an_error(backend):
    x = backend.from_host(np.ones(3, np.float32))
    with pytest.raises(RuntimeError, match="during graph capture"):
        backend.capture(lambda: backend.to_host(x))
    with pytest.raises(RuntimeError, match="during graph capture"):
        backend.capture(backend.synchronize)
    backend.synchronize()  # capture mode ended with the error


def test_clear_and_supports_graphs(backend):
    backend.zeros((1,), np.float32)
    assert backend.events and backend.supports_graphs
    backend.clear()
    assert backend.events == [] and backend.count("alloc") == 0


def test_capture_leaves_device_state_alone(backend):
    """Only replays write caches and buffers, so a captured step does not run twice."""
    k = backend.from_host(np.ones((1, 1, 4), np.float32))
    k_cache = backend.zeros((1, 4, 1, 4), np.float32)
    v_cache = backend.zeros((1, 4, 1, 4), np.float32)
    slots = backend.from_host(np.array([2], np.int32))
    out = backend.zeros((1, 1, 4), np.float32)

    def step():
        backend.ops.reshape_and_cache(k, k, k_cache, v_cache, slots)
        backend.copy_(out, backend.ops.add(k, k))

    graph = backend.capture(step)
    assert graph.ops == ["reshape_and_cache", "add"]
    assert not backend.to_host(k_cache).any() and not backend.to_host(out).any()
    graph.replay()
    assert backend.to_host(k_cache)[0, 2].tolist() == [[1.0] * 4]
    assert backend.to_host(out).tolist() == [[[2.0] * 4]]
