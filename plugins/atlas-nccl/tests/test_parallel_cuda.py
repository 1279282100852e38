"""On GPUs: the parallel ops' cuda kernels against their references, NCCL collectives between
two processes (eager and captured in a CUDA graph), and tensor / expert parallel engines
against one GPU. Skipped without a device (two for the multi-GPU tests) or without nccl4py.

Tolerances: the ops copy or select values, so they must match exactly; float32 engines must
pick the same greedy tokens with logprobs within 1e-3 (the all-reduce adds partial sums in
another order than one GPU's GEMM)."""

import multiprocessing
import os
import time

import numpy as np
import pytest

from atlas_core.api import EngineArgs, LLMEngine, Registry, SamplingParams, bfloat16
from atlas_core.testing.checkpoints import write_tiny_checkpoint

from nccl_cuda_probe import HAS_GPU, HAS_NCCL, NUM_GPUS

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HAS_GPU, reason="no CUDA device")]
two_gpus = pytest.mark.skipif(NUM_GPUS < 2 or not HAS_NCCL, reason="needs 2 GPUs and nccl4py")


@pytest.fixture(scope="module")
def backends():
    registry = Registry()
    return registry.create("gpu_backends", "cuda"), registry.create("gpu_backends", "numpy")


def _both(backends, name, *args):
    cuda, host = backends
    moved = [cuda.from_host(a) if isinstance(a, np.ndarray) else a for a in args]
    got = getattr(cuda.ops, name)(*moved)
    want = getattr(host.ops, name)(*args)
    if isinstance(want, tuple):
        return [cuda.to_host(g) for g in got], list(want)
    return [cuda.to_host(got)], [want]


@pytest.mark.parametrize("dtype", [np.float32, bfloat16])
def test_parallel_ops_match_references(backends, dtype):
    rng = np.random.default_rng(0)
    cases = [("moe_remap_ids", rng.random((33, 8), np.float32),
              rng.integers(0, 128, (33, 8)).astype(np.int32), 32, 32),
             ("embedding_shard", rng.integers(0, 1000, 37).astype(np.int32),
              rng.standard_normal((500, 96)).astype(dtype), 500),
             ("gather_vocab_shards", rng.standard_normal((4, 3, 1000)).astype(dtype), 3997)]
    for name, *args in cases:
        for got, want in zip(*_both(backends, name, *args)):
            np.testing.assert_array_equal(got, want, err_msg=name)


class _FileStore:
    """The rendezvous the nccl comm needs (``set`` / ``get``), as files in a shared folder."""

    def __init__(self, root):
        self.root = root

    def set(self, key, value):
        path = os.path.join(self.root, key.replace("/", "_"))
        with open(path + ".tmp", "wb") as f:
            f.write(value)
        os.replace(path + ".tmp", path)

    def get(self, key, timeout=60):
        path = os.path.join(self.root, key.replace("/", "_"))
        deadline = time.monotonic() + timeout
        while not os.path.exists(path):
            assert time.monotonic() < deadline, f"{key} never published"
            time.sleep(0.05)
        with open(path, "rb") as f:
            return f.read()


def _rank(rank, root, out):
    # device_id, not CUDA_VISIBLE_DEVICES: importing this module already started CUDA here
    registry = Registry()
    backend = registry.create("gpu_backends", "cuda", device_id=rank)
    comm = registry.create("comm_backends", "nccl", rank=rank, world_size=2, backend=backend,
                           store=_FileStore(root), timeout=60)
    x = backend.from_host(np.full((4, 256), rank + 1, np.float32))
    eager = backend.to_host(comm.all_reduce(x)).copy()
    gathered = backend.to_host(comm.all_gather(backend.from_host(np.full((2, 3), rank, bfloat16))))
    y = backend.from_host(np.full(1024, rank + 1, bfloat16))
    graph = backend.capture(lambda: comm.all_reduce(y))
    backend.copy_from_host(y, np.full(1024, 2 * (rank + 1), bfloat16))
    graph.replay()
    replayed = backend.to_host(y).astype(np.float32)
    # The peer-memory path against NCCL on random bf16 (sums in float32 either way: equal
    # within one bf16 rounding), the same bits on both ranks, eager and replayed many times
    # (its epochs live on the device), and a tensor past its limit taken by NCCL.
    rng = np.random.default_rng(rank)
    data = rng.standard_normal((8, 4096)).astype(bfloat16)
    a, b = backend.from_host(data), backend.from_host(data)
    p2p = comm.all_reduce(a)
    ref = comm.nccl_all_reduce(b)
    z = backend.from_host(data)
    graph2 = backend.capture(lambda: [comm.all_reduce(z) for _ in range(3)])
    sums = []
    for i in range(5):
        backend.copy_from_host(z, (data.astype(np.float32) * (i + 1) / 8).astype(bfloat16))
        graph2.replay()
        sums.append(backend.to_host(z).astype(np.float32).copy())
    big = backend.from_host(np.full((600, 1024), rank + 1, np.float32))  # 2.4 MB: NCCL
    calls = comm._p2p.calls if comm._p2p is not None else -1
    comm.all_reduce(big)
    backend.synchronize()
    out.put((rank, eager, gathered, replayed, comm._p2p is not None,
             backend.to_host(p2p).astype(np.float32), backend.to_host(ref).astype(np.float32),
             sums, bool((backend.to_host(big) == 3).all()),
             calls == (comm._p2p.calls if comm._p2p is not None else -1)))
    comm.close()


@two_gpus
def test_nccl_collectives_across_two_gpus_eager_and_in_a_graph(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, str(tmp_path), out)) for r in range(2)]
    for p in procs:
        p.start()
    got = {r: rest for r, *rest in (out.get(timeout=120) for _ in procs)}
    for p in procs:
        p.join(30)
    for rank in range(2):
        eager, gathered, replayed, used_p2p, p2p, ref, sums, big_ok, big_on_nccl = got[rank]
        assert (eager == 3).all()
        assert (gathered.astype(np.float32) == [[0] * 3] * 2 + [[1] * 3] * 2).all()
        assert (replayed == 6).all()
        assert used_p2p, "the peer-memory all-reduce was not set up between the two GPUs"
        np.testing.assert_allclose(p2p, ref, rtol=1e-2, atol=1e-2)
        assert big_ok and big_on_nccl
    assert (got[0][4] == got[1][4]).all(), "ranks hold different sums"
    data = [np.random.default_rng(r).standard_normal((8, 4096)).astype(bfloat16)
            .astype(np.float32) for r in range(2)]
    for i in range(5):
        scaled = [(d * (i + 1) / 8).astype(bfloat16).astype(np.float32) for d in data]
        want = scaled[0] + scaled[1]  # three all-reduces in a row: x2 after each extra one
        np.testing.assert_allclose(got[0][6][i], want * 4, rtol=2e-2, atol=2e-2)
        assert (got[0][6][i] == got[1][6][i]).all()


def _generate(path, tp, ep=False):
    engine = LLMEngine.from_args(EngineArgs(model=str(path), backend="cuda", max_num_seqs=4,
                                            num_kv_blocks=64, tensor_parallel_size=tp,
                                            enable_expert_parallel=ep))
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=1)
    for i, prompt in enumerate([[1, 2, 3, 4, 5, 6, 7], [9, 8, 7]]):
        engine.add_request(f"r{i}", prompt, params)
    out = {}
    while engine.has_unfinished_requests():
        for o in engine.step():
            if o.finished:
                out[o.request_id] = (o.outputs[0].token_ids,
                                     [lp.logprob for lp in o.outputs[0].logprobs])
    if tp > 1:
        engine.runner.shutdown()
    return out


@two_gpus
@pytest.mark.parametrize("arch,ep", [("Qwen3ForCausalLM", False), ("Qwen3MoeForCausalLM", False),
                                     ("Qwen3MoeForCausalLM", True)])
def test_two_gpu_engine_matches_one_gpu(tmp_path, arch, ep):
    path = write_tiny_checkpoint(arch, tmp_path, vocab_size=381)
    single, parallel = _generate(path, 1), _generate(path, 2, ep)
    assert {k: v[0] for k, v in parallel.items()} == {k: v[0] for k, v in single.items()}
    for k in single:
        assert parallel[k][1] == pytest.approx(single[k][1], abs=1e-3)
