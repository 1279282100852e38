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
    used_p2p = comm._p2p is not None
    failures, digests = _p2p_both_modes(backend, comm, rank) if used_p2p else ([], {})
    # all-to-all-v: rank r sends rank d (r + d + 1) rows of 10 r + d; the counts exchanged first
    send = [backend.from_host(np.full((rank + d + 1, 3), 10 * rank + d, np.float32))
            for d in range(2)]
    rows = comm.all_to_all_rows([rank + d + 1 for d in range(2)])
    parts = [backend.to_host(a) for a in comm.all_to_all(send, rows)]
    if rows != [rank + 1, rank + 2] or any(
            not np.array_equal(p, np.full((src + rank + 1, 3), 10 * src + rank))
            for src, p in enumerate(parts)):
        failures.append(f"all-to-all-v: rows {rows}, parts {[p.shape for p in parts]}")
    big = backend.from_host(np.full((600, 1024), rank + 1, np.float32))  # 2.4 MB: NCCL
    calls = comm._p2p.calls if used_p2p else -1
    comm.all_reduce(big)
    backend.synchronize()
    out.put((rank, eager, gathered, replayed, used_p2p, failures, digests,
             bool((backend.to_host(big) == 3).all()),
             calls == (comm._p2p.calls if used_p2p else -1)))
    comm.close()


#: (dtype, bytes) of the peer-memory checks: 2, 16 and 64 blocks, and 777 vectors (4 blocks of
#: 195: slices that no power-of-two size has). Interleaved in one graph, the blocks' epochs
#: drift apart, as they do when a server replays graphs of several batch sizes.
P2P_CASES = [(dt, n) for dt in (bfloat16, np.float32) for n in (8 << 10, 64 << 10, 1 << 20,
                                                                777 * 16)]
REPLAYS = 4


def _p2p_input(case, rank, scale=1.0):
    dtype, nbytes = P2P_CASES[case]
    rng = np.random.default_rng(100 * case + rank)
    n = nbytes // np.dtype(dtype).itemsize
    return (rng.standard_normal(n).astype(np.float32) * scale).astype(dtype)


def _p2p_want(case, scale=1.0):
    """What every rank must hold: float32 sums in rank order, rounded once (as the kernel)."""
    parts = [_p2p_input(case, r, scale).astype(np.float32) for r in range(2)]
    return (parts[0] + parts[1]).astype(P2P_CASES[case][0])


def _p2p_both_modes(backend, comm, rank):
    """The peer-memory all-reduce in every protocol (switched on both ranks at the same call),
    eager and replayed from a graph, against the rank-order sum (bit for bit, so pull and push
    agree bit for bit) and NCCL (within rounding). Returns failures and a digest per output."""
    import hashlib
    failures, digests = [], {}

    def check(label, got, want):
        digests[label] = hashlib.sha1(got.tobytes()).hexdigest()
        if not np.array_equal(got.view(np.uint8), want.view(np.uint8)):
            bad = np.flatnonzero(got.astype(np.float32) != want.astype(np.float32))
            failures.append(f"{label}: {bad.size} elements differ from the rank-order sum, "
                            f"first at {bad[:4]}")

    # back to earlier modes: switching keeps the epochs in step (ll hands its 1 MB case to push)
    for mode in ("pull", "push", "ll", "push", "pull"):
        comm._p2p.mode = mode
        for case, (dtype, _) in enumerate(P2P_CASES):
            x, ref = backend.from_host(_p2p_input(case, rank)), backend.from_host(
                _p2p_input(case, rank))
            for _ in range(2):  # the same call twice, so the second uses the other slot
                got = backend.to_host(comm.all_reduce(x)).copy()
                backend.copy_from_host(x, _p2p_input(case, rank))
            check(f"{mode} eager {case}", got, _p2p_want(case))
            nccl = backend.to_host(comm.nccl_all_reduce(ref)).astype(np.float32)
            tol = 1e-2 if dtype is bfloat16 else 1e-6
            if not np.allclose(got.astype(np.float32), nccl, rtol=tol, atol=tol):
                failures.append(f"{mode} eager {case}: not NCCL's sum")
        zs = [backend.from_host(_p2p_input(c, rank)) for c in range(len(P2P_CASES))]
        graph = backend.capture(lambda: [comm.all_reduce(z) for z in zs + zs[:1]])
        for i in range(REPLAYS):
            scale = (i + 1) / REPLAYS
            for c, z in enumerate(zs):
                backend.copy_from_host(z, _p2p_input(c, rank, scale))
            graph.replay()
            for c, z in enumerate(zs):
                want = _p2p_want(c, scale)
                if c == 0:  # reduced twice in a row: both ranks held the sum, so twice it
                    want = (want.astype(np.float32) * 2).astype(want.dtype)
                check(f"{mode} graph {i} {c}", backend.to_host(z), want)
    return failures, digests


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
        eager, gathered, replayed, used_p2p, failures, _, big_ok, big_on_nccl = got[rank]
        assert (eager == 3).all()
        assert (gathered.astype(np.float32) == [[0] * 3] * 2 + [[1] * 3] * 2).all()
        assert (replayed == 6).all()
        assert used_p2p, "the peer-memory all-reduce was not set up between the two GPUs"
        assert not failures, f"rank {rank}: " + "; ".join(failures[:8])
        assert big_ok and big_on_nccl
    assert got[0][5] == got[1][5], "ranks hold different sums"
    pull = {k.split(" ", 1)[1]: v for k, v in got[0][5].items() if k.startswith("pull")}
    push = {k.split(" ", 1)[1]: v for k, v in got[0][5].items() if k.startswith("push")}
    ll = {k.split(" ", 1)[1]: v for k, v in got[0][5].items() if k.startswith("ll")}
    assert pull == push and len(push) == len(P2P_CASES) * (1 + REPLAYS), "push differs from pull"
    assert ll == push, "ll differs from push"


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
