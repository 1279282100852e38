"""This plugin's ops: specs registered here (not in core), the numpy table's bindings, every
contract case on numpy and mock (and cuda with a GPU), the chunked SSD reference against the
token-by-token one and against HF's torch functions, and batch invariance of the numba scan."""

from __future__ import annotations

import types

import numpy as np
import pytest

from atlas_core.api import OpRegistry, Registry, make_plugin_manager, resolve
from atlas_core.testing.contracts_cases import check_case
from atlas_nemotron_h import mamba2_numpy, mamba2_reference as ref
from atlas_nemotron_h.plugin import OPS

NAMES = [spec.name for spec, _, _ in OPS]
CASES = [(spec.name, case) for spec, _, _ in OPS for case in resolve(spec.cases)()]
IDS = [f"{name}-{case.id}" for name, case in CASES]
SIZES = dict(num_heads=4, head_dim=8, n_groups=2, state_size=16)


@pytest.fixture(scope="module")
def ops(registry):
    return OpRegistry(registry)


def test_specs_come_from_this_plugin_not_core(ops):
    for name in NAMES:
        assert ops.owner(name) == "nemotron_h" and ops.spec(name).cases is not None
    core = OpRegistry(Registry(make_plugin_manager(entry_points=False)))
    assert not set(NAMES) & set(core.names())
    assert ops.backends("mamba2_ssd_chunked") == ["cuda", "numpy"]


def test_numpy_table_takes_numba_scans_and_the_unfused_decode(backend):
    assert backend.ops.mamba2_ssd_chunked is mamba2_numpy.mamba2_ssd_chunked
    assert backend.ops.mamba2_ssd_recurrent is mamba2_numpy.mamba2_ssd_recurrent
    decode = backend.ops.mamba2_decode
    assert isinstance(decode, types.MethodType) and decode.__func__ is ref.compose_mamba2_decode
    assert backend.ops.mamba2_conv1d is ref.mamba2_conv1d


@pytest.mark.parametrize("name,case", CASES, ids=IDS)
@pytest.mark.parametrize("kind", ["numpy", "mock"])
def test_contract_case(registry, ops, kind, name, case):
    check_case(registry.create("gpu_backends", kind), ops, name, case)


@pytest.mark.gpu
@pytest.mark.parametrize("name,case", CASES, ids=IDS)
def test_contract_case_on_cuda(cuda_backend, ops, name, case):
    if name not in cuda_backend.ops:
        pytest.skip(f"the cuda backend has no {name!r}")
    check_case(cuda_backend, ops, name, case)


def _sequence(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    conv_dim = SIZES["num_heads"] * SIZES["head_dim"] + 2 * SIZES["n_groups"] * SIZES["state_size"]
    xbc = rng.standard_normal((n, conv_dim)).astype(np.float32)
    dt = rng.standard_normal((n, 4)).astype(np.float32)
    params = (np.log(rng.uniform(0.5, 4, 4)).astype(np.float32),
              (0.3 * rng.standard_normal(4)).astype(np.float32),
              rng.standard_normal(4).astype(np.float32))
    return xbc, dt, params


def _scan(fn, xbc, dt, params, chunks, **kw):
    """Run ``fn`` over ``chunks`` consecutive steps of one sequence; outputs and final state."""
    pool = np.zeros((1, 4, 8, 16), np.float32)
    outs, start = [], 0
    for n in chunks:
        cu, lens = np.array([0, n], np.int32), np.array([start + n], np.int32)
        a_log, dt_bias, d = params
        outs.append(fn(xbc[start:start + n], dt[start:start + n], a_log, dt_bias, d, pool, cu,
                       lens, np.zeros(1, np.int32), **SIZES, **kw))
        start += n
    return np.concatenate(outs), pool[0]


def test_chunked_reference_equals_recurrent_reference():
    xbc, dt, params = _sequence(53)
    y_rec, s_rec = _scan(ref.mamba2_ssd_recurrent, xbc, dt, params, [53])
    for chunks in ([53], [20, 33], [1, 16, 36]):
        y, s = _scan(ref.mamba2_ssd_chunked, xbc, dt, params, chunks, chunk_size=16)
        np.testing.assert_allclose(y, y_rec, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(s, s_rec, rtol=1e-4, atol=1e-4)


def test_numba_scan_is_the_same_bits_however_the_sequence_is_split():
    xbc, dt, params = _sequence(40, seed=1)
    y0, s0 = _scan(mamba2_numpy.mamba2_ssd_chunked, xbc, dt, params, [40])
    y1, s1 = _scan(mamba2_numpy.mamba2_ssd_chunked, xbc, dt, params, [7, 1, 1, 31])
    assert np.array_equal(y0, y1) and np.array_equal(s0, s1)
    y_ref, _ = _scan(ref.mamba2_ssd_recurrent, xbc, dt, params, [40])
    np.testing.assert_allclose(y0, y_ref, rtol=1e-5, atol=1e-5)


def test_references_match_hf_torch_functions():
    torch = pytest.importorskip("torch")
    hf = pytest.importorskip("transformers.models.nemotron_h.modeling_nemotron_h")
    xbc, dt, (a_log, dt_bias, d) = _sequence(37, seed=2)
    y, state = _scan(ref.mamba2_ssd_chunked, xbc, dt, (a_log, dt_bias, d), [37], chunk_size=16)
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a)).double()  # noqa: E731
    x, b, c = xbc[:, :32], xbc[:, 32:64], xbc[:, 64:]
    y_hf, s_hf = hf.mamba2_chunk_scan(
        t(x).view(1, 37, 4, 8), t(dt)[None], -torch.exp(t(a_log)), t(b).view(1, 37, 2, 16),
        t(c).view(1, 37, 2, 16), chunk_size=16, D=t(d), dt_bias=t(dt_bias), dt_softplus=True,
        return_final_states=True)
    np.testing.assert_allclose(y, y_hf.reshape(37, 32).numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(state, s_hf[0].numpy(), rtol=1e-4, atol=1e-4)
    rng = np.random.default_rng(3)
    yy, z, w = (rng.standard_normal(s).astype(np.float32) for s in ((5, 32), (5, 32), (32,)))
    norm = hf.NemotronHRMSNormGated(32, group_size=16, eps=1e-5)
    norm.weight.data = torch.from_numpy(w)
    expected = norm(torch.from_numpy(yy), torch.from_numpy(z)).detach().numpy()
    np.testing.assert_allclose(ref.mamba2_gated_norm(yy, z, w, 16, 1e-5), expected,
                               rtol=1e-5, atol=1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("state_size", [16, 128, 256])
def test_chunked_time_scan_matches_the_token_scan_on_cuda(cuda_backend, monkeypatch, dtype,
                                                          state_size):
    """Prefill steps (more tokens than sequences) run ``mamba2_scan_chunked``: sequences of
    several staged chunks (32 tokens at N <= 128, 16 at 256) and partial ones, one continuing
    from its slot, a padding row and one-token rows, against the token-by-token kernel
    (``ATLAS_MAMBA2_SCAN=token``: the same state update) and the reference."""
    from atlas_core.testing.contracts_ops import as_dtype

    heads, head_dim, groups = 8, 24, 2
    sizes = dict(num_heads=heads, head_dim=head_dim, n_groups=groups, state_size=state_size,
                 dt_min=0.001, dt_max=float("inf"))
    rng = np.random.default_rng(state_size)
    lens = [70, 1, 45, 33]
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    seq_lens = np.array([75, 1, 45, 33], np.int32)    # the first continues from its slot
    slots = np.array([2, 0, -1, 3], np.int32)         # slot 1 is nobody's: left as it was
    n = int(cu[-1])
    xbc = rng.standard_normal((n, heads * head_dim + 2 * groups * state_size))
    xbc = xbc.astype(as_dtype(dtype))
    dt = (2 * rng.standard_normal((n, heads))).astype(as_dtype(dtype))
    a_log = np.log(rng.uniform(0.5, 4, heads)).astype(np.float32)
    dt_bias, d = (rng.standard_normal(heads).astype(np.float32) for _ in range(2))
    pool = rng.standard_normal((4, heads, head_dim, state_size)).astype(np.float32)
    host = [xbc, dt, a_log, dt_bias, d]
    layout = [cu, seq_lens, slots]

    def run(kind):
        monkeypatch.setenv("ATLAS_MAMBA2_SCAN", kind)
        dev_pool = cuda_backend.from_host(pool)
        y = cuda_backend.ops.mamba2_ssd_chunked(
            *(cuda_backend.from_host(a) for a in host), dev_pool,
            *(cuda_backend.from_host(a) for a in layout), **sizes)
        return cuda_backend.to_host(y).astype(np.float32), cuda_backend.to_host(dev_pool)

    y_tok, s_tok = run("token")
    y_chk, s_chk = run("chunked")
    want_pool = pool.copy()
    want = ref.mamba2_ssd_recurrent(*host, want_pool, *layout, **sizes).astype(np.float32)
    np.testing.assert_allclose(s_chk, s_tok, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(s_chk, want_pool, rtol=1e-3, atol=1e-3)
    tol = 1e-4 if dtype == "float32" else 2e-2
    scale = max(1.0, float(np.abs(want).max()))
    assert np.abs(y_chk - y_tok).max() <= tol * scale
    assert np.abs(y_chk - want).max() <= tol * scale


def test_fused_cuda_decode_plan_and_its_wave_rule(monkeypatch):
    """The fused CUDA decode kernel's block plan (no GPU needed): a cluster per SSM group of at
    most 8 blocks, the block's channels within a build's registers; the separate kernels where
    nothing fits or its blocks pass one an SM; the environment knob checked."""
    mamba2_ops = pytest.importorskip("atlas_nemotron_h.cuda.mamba2_ops")
    plan = mamba2_ops.decode_plan
    assert plan(64, 64, 8, 128) == (1, 8, 4)      # Nemotron-3 Nano: 8 heads a group
    assert plan(128, 64, 8, 128) == (2, 16, 4)    # 16 heads a group: two a block, 8 blocks
    assert plan(8, 64, 1, 256) is None            # conv channels past the block's threads
    assert plan(128, 80, 8, 128) is None          # 160 channels a block: no build holds them
    assert plan(6, 8, 4, 16) is None              # heads not a multiple of the groups
    fits = mamba2_ops.fused_fits
    assert fits(2, 64, 1, 132) and not fits(3, 64, 1, 132)
    assert fits(2, 128, 2, 132) and not fits(3, 128, 2, 132)
    for kind in ("auto", "fused", "ops"):
        monkeypatch.setenv(mamba2_ops.DECODE_KERNEL_ENV, kind)
        assert mamba2_ops.decode_kernel() == kind
    monkeypatch.setenv(mamba2_ops.DECODE_KERNEL_ENV, "fast")
    with pytest.raises(ValueError, match="ATLAS_MAMBA2_DECODE='fast'"):
        mamba2_ops.decode_kernel()


@pytest.mark.parametrize("env, tokens, n_group, experts, kernels", [
    ("auto", 1, 1, 128, ["nemotron_h_moe_route1"]),
    ("two", 1, 1, 128, ["nemotron_h_moe_logits", "nemotron_h_moe_select"]),
    ("fused", 1, 1, 128, ["nemotron_h_moe_route1"]),
    ("fused", 512, 1, 512, ["nemotron_h_moe_route1"]),
    ("fused", 513, 1, 128, ["nemotron_h_moe_logits", "nemotron_h_moe_select"]),
    ("fused", 4, 8, 256, ["nemotron_h_moe_logits", "nemotron_h_moe_select"]),
    ("fused", 4, 1, 513, ["nemotron_h_moe_logits", "nemotron_h_moe_select"]),
])
def test_router_kernels_by_environment_and_shape(monkeypatch, env, tokens, n_group, experts,
                                                 kernels):
    """The one-kernel router (``auto`` and ``fused``) where it applies (n_group 1, at most 512
    experts and 512 tokens: 64 counters of 8-token groups), the two kernels elsewhere and with
    ATLAS_NEMOTRON_ROUTE=two (no GPU needed: the launches are recorded)."""
    moe_ops = pytest.importorskip("atlas_nemotron_h.cuda.moe_ops")
    monkeypatch.setenv(moe_ops.ROUTE_KERNEL_ENV, env)
    launches = []

    class Arr(types.SimpleNamespace):
        pass

    def out(shape, dtype):
        return Arr(shape=tuple(shape), dtype=np.dtype(dtype))

    backend = types.SimpleNamespace(capturing=False, zeros=lambda shape, dtype: out(shape, dtype))
    ctx = types.SimpleNamespace(
        pdl=True, backend=backend, out=out, f32=lambda a: a,
        sync_counters=lambda: out((8192,), np.int32),
        kernel=lambda module, dtype, name: name,
        launch=lambda k, grid, block, *args, pdl: launches.append((k, grid)))
    ops = moe_ops.NemotronMoeCudaOps(ctx)
    x = out((tokens, 64), np.float32)
    ops.nemotron_h_moe_route(x, out((experts, 64), np.float32), out((experts,), np.float32), 6,
                             n_group=n_group, topk_group=1)
    assert [k for k, _ in launches] == kernels
    assert launches[0][1] == ((experts, -(-tokens // 8)) if kernels[0] != "nemotron_h_moe_select"
                              else tokens)
    monkeypatch.setenv(moe_ops.ROUTE_KERNEL_ENV, "fastest")
    with pytest.raises(ValueError, match="ATLAS_NEMOTRON_ROUTE='fastest'"):
        moe_ops.route_kernel()
