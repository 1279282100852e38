"""NVFP4 KV cache on the GPU against the NumPy reference: the write kernel's bytes (exactly the
reference's), decode attention over packed rows at several context lengths (one split and
many, CUDA graph replay), prefill over an nvfp4 history (gather + flash), and a tiny Qwen3's
greedy tokens with ``--kv-cache-dtype nvfp4`` on cuda against numpy."""

import numpy as np
import pytest

from atlas_core.api import bfloat16
from atlas_core.api import reference as ref
from atlas_core.api import nvfp4_row_bytes, quantize_kv_nvfp4

from cuda_probe import HAS_GPU, device_rel_error

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HAS_GPU, reason="no CUDA device")]
BS = 16


def packed_paged(rng, batch, h, kh, d, max_ctx):
    """q (bf16), packed K/V pools of quantized normal values, and block tables."""
    width = -(-max_ctx // BS)
    blocks = batch * width + 4
    kc = quantize_kv_nvfp4(rng.standard_normal((blocks, BS, kh, d)).astype(np.float32) * 2)
    vc = quantize_kv_nvfp4(rng.standard_normal((blocks, BS, kh, d)).astype(np.float32))
    tables = rng.permutation(blocks)[:batch * width].reshape(batch, width).astype(np.int32)
    q = rng.standard_normal((batch, h, d)).astype(np.float32).astype(bfloat16)
    return q, kc, vc, tables


@pytest.mark.parametrize("dtype", [bfloat16, np.float32])
@pytest.mark.parametrize("kh,d", [(2, 64), (8, 128), (4, 256)])
def test_write_kernel_bytes_equal_the_reference(cuda_backend, dtype, kh, d):
    be = cuda_backend
    rng = np.random.default_rng(d + kh)
    t, blocks = 300, 24
    k = (rng.standard_normal((t, kh, d)) * np.exp(rng.uniform(-9, 7, (t, kh, 1)))).astype(
        np.float32)
    v = rng.standard_normal((t, kh, d)).astype(np.float32)
    k[0, 0, :16] = 0
    k[1, 0, :16] = 1e-4  # a scale that rounds to zero
    k[2, 0, 16:32] = 5000  # a saturated scale
    v[3, 0, :32] = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0] * 4  # every tie at scale 1
    k, v = k.astype(dtype), v.astype(dtype)
    slots = rng.permutation(blocks * BS)[:t].astype(np.int32)
    slots[5] = -1
    shape = (blocks, BS, kh, nvfp4_row_bytes(d))
    want_k, want_v = np.full(shape, 0xAB, np.uint8), np.full(shape, 0xAB, np.uint8)
    dk, dv = be.from_host(want_k), be.from_host(want_v)
    be.ops.reshape_and_cache(be.from_host(k), be.from_host(v), dk, dv, be.from_host(slots))
    ref.reshape_and_cache(k, v, want_k, want_v, slots)
    for label, dev, want in (("k", dk, want_k), ("v", dv, want_v)):
        got = be.to_host(dev)
        bad = np.argwhere(got != want)
        assert not len(bad), f"{label}: {len(bad)} bytes differ, first at {bad[0].tolist()}"


@pytest.mark.parametrize("h,kh,d", [(32, 8, 128), (16, 2, 256), (8, 8, 64), (32, 4, 128)])
@pytest.mark.parametrize("ctx", [17, 700, 5000, 32768])
def test_decode_matches_the_reference(cuda_backend, h, kh, d, ctx):
    be = cuda_backend
    rng = np.random.default_rng(ctx + d)
    batch = 3
    q, kc, vc, bt = packed_paged(rng, batch, h, kh, d, ctx)
    sl = np.array([ctx, max(1, ctx // 3), 1], np.int32)
    cu = np.arange(batch + 1, dtype=np.int32)
    got = be.ops.paged_attention(*(be.from_host(a) for a in (q, kc, vc, bt, sl, cu)), d ** -0.5)
    want = ref.paged_attention(q, kc, vc, bt, sl, cu, d ** -0.5)
    assert device_rel_error(be, got, want) < 1e-2


def test_decode_graph_replay_with_changing_lengths(cuda_backend):
    be = cuda_backend
    h, kh, d, batch = 32, 8, 128, 2
    rng = np.random.default_rng(3)
    q, kc, vc, bt = packed_paged(rng, batch, h, kh, d, 8192)
    dev = [be.from_host(a) for a in (q, kc, vc, bt)]
    sl = be.from_host(np.ones(batch, np.int32))
    cu = np.arange(batch + 1, dtype=np.int32)
    dcu = be.from_host(cu)
    graph = be.capture(lambda: be.ops.paged_attention(*dev, sl, dcu, d ** -0.5))
    for lens in ([1, 5], [17, 300], [8192, 4000], [999, 2]):
        lens = np.array(lens, np.int32)
        be.copy_from_host(sl, lens)
        graph.replay()
        want = ref.paged_attention(q, kc, vc, bt, lens, cu, d ** -0.5)
        assert device_rel_error(be, graph.output, want) < 1e-2, lens


@pytest.mark.parametrize("d", [64, 128])
def test_prefill_over_an_nvfp4_history(cuda_backend, d):
    """A 300-token chunk after 1,000 cached tokens and a first chunk: the gather + flash path."""
    be = cuda_backend
    rng = np.random.default_rng(d)
    h, kh = 16, 4
    _, kc, vc, bt = packed_paged(rng, 2, h, kh, d, 1300)
    q = rng.standard_normal((400, h, d)).astype(np.float32).astype(bfloat16)
    sl, cu = np.array([1300, 100], np.int32), np.array([0, 300, 400], np.int32)
    got = be.ops.paged_attention(*(be.from_host(a) for a in (q, kc, vc, bt, sl, cu)), d ** -0.5)
    want = ref.paged_attention(q, kc, vc, bt, sl, cu, d ** -0.5)
    assert device_rel_error(be, got, want) < 1e-2


def test_tiny_model_greedy_tokens_match_numpy(tmp_path):
    from atlas_core.api import EngineArgs, LLMEngine, SamplingParams
    from atlas_core.testing.checkpoints import write_tiny_checkpoint
    from atlas_core.testing.fake_model import run_to_completion
    path = write_tiny_checkpoint("Qwen3ForCausalLM", tmp_path / "qwen3", dtype="bfloat16",
                                 head_dim=64, num_hidden_layers=4)
    rng = np.random.default_rng(5)
    prompts = [rng.integers(0, 370, n).tolist() for n in (5, 40, 200, 480)]  # tiny max 512
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, logprobs=2)
    outs = {}
    for backend in ("numpy", "cuda"):
        engine = LLMEngine.from_args(EngineArgs(
            model=str(path), backend=backend, kv_cache_dtype="nvfp4", num_kv_blocks=256,
            max_num_seqs=4, gpu_memory_utilization=0.3))
        assert engine.kv_config.dtype_summary == "nvfp4 (2 layers), bfloat16 (2 layers: 0, 3)"
        for i, p in enumerate(prompts):
            engine.add_request(f"r{i}", p, params)
        done = run_to_completion(engine)
        outs[backend] = [done[f"r{i}"].outputs[0] for i in range(len(prompts))]
    # bf16 activations round differently on the two backends, and a different rounding before
    # the 4-bit cache moves a value to another code: the random tiny model's near-ties may
    # flip (prompt 1's first token: top-2 log-probs 0.016 apart on numpy, and bf16 vs nvfp4 KV
    # on numpy alone picks differently). So: tokens equal up to the first difference, and
    # there the numpy top-2 gap is a near-tie.
    for want, got in zip(outs["numpy"], outs["cuda"]):
        first = next((i for i, (a, b) in enumerate(zip(want.token_ids, got.token_ids))
                      if a != b), None)
        if first is not None:
            (t0, lp0), (t1, lp1) = want.logprobs[first].top[:2]
            assert got.token_ids[first] in (t0, t1) and lp0 - lp1 < 0.05, (
                first, want.token_ids, got.token_ids)
