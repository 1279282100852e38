"""DRY, XTC and top-n-sigma: the references by hand, exact distributions (on numpy, and on cuda
where there is a GPU), the engine path and the host fallback for backends without the ops."""

import numpy as np
import pytest

from atlas_core.engine import SamplingParams
from atlas_core.engine.logits_filters import apply_logits_filters, breaker_ids
from atlas_core.ops import logits_filters as ref
from atlas_core.ops.sampling import filter_probs
from atlas_core.plugins import Registry
from atlas_core.testing.fake_model import FakeCausalLM, make_fake_engine, run_to_completion

LOGITS = np.array([2.0, 1.5, 1.0, 0.6, 0.3, 0.0, -0.5, -1.0], np.float32)
NUM = 4000


def _softmax(x):
    z = np.exp(x - x[np.isfinite(x)].max())
    return z / z.sum()


def _numpy():
    return Registry().create("gpu_backends", "numpy")


@pytest.fixture(scope="module", params=["numpy", pytest.param("cuda", marks=pytest.mark.gpu)])
def backend(request):
    be = Registry().create("gpu_backends", request.param)
    yield be
    be.close()


def _op(backend, name, *args):
    """``backend.ops.<name>`` on host arrays (uploaded), its result downloaded."""
    return np.asarray(backend.to_host(getattr(backend.ops, name)(
        *(backend.from_host(a) for a in args))))


def _sample_counts(backend, logits_rows, temperature=1.0):
    num = len(logits_rows)
    out = _op(backend, "sample", logits_rows, np.full(num, temperature, np.float32),
              np.zeros(num, np.int32), np.ones(num, np.float32),
              np.zeros(num, np.float32), np.arange(10_000, 10_000 + num, dtype=np.uint64),
              np.ones(num, np.int64))
    return np.bincount(out, minlength=LOGITS.shape[0])


def _assert_follows(counts, probs):
    probs = probs / probs.sum()
    assert counts[probs == 0].sum() == 0, f"filtered tokens were sampled: {counts}"
    expected = probs[probs > 0] * counts.sum()
    chi2 = float(((counts[probs > 0] - expected) ** 2 / expected).sum())
    # 99.99th percentile of chi-square with <= 7 degrees of freedom is about 29.9.
    assert chi2 < 30.0, f"token counts {counts} do not follow {probs} (chi2 {chi2:.1f})"


def test_dry_by_hand():
    ctx = np.array([[1, 2, 3, 1, 2, -1]], np.int32)
    logits = np.zeros((1, 8), np.float32)
    args = (np.array([1.0], np.float32), np.array([1.75], np.float32), np.array([2], np.int32))
    out = ref.apply_dry(logits, ctx, *args, np.array([[-1]], np.int32))
    # "1 2" was followed by 3 before: a match of 2 tokens -> 1.0 * 1.75 ** 0
    np.testing.assert_allclose(out, [[0, 0, 0, -1.0, 0, 0, 0, 0]])
    broken = ref.apply_dry(logits, ctx, *args, np.array([[1]], np.int32))
    np.testing.assert_array_equal(broken, logits)
    longer = ref.apply_dry(logits, np.array([[4, 1, 2, 3, 4, 1, 2]], np.int32), *args,
                           np.array([[-1]], np.int32))
    assert longer[0, 3] == pytest.approx(-1.75 ** 1)
    off = ref.apply_dry(logits, ctx, np.zeros(1, np.float32), *args[1:], np.array([[-1]], np.int32))
    np.testing.assert_array_equal(off, logits)


def test_xtc_by_hand_removes_all_top_choices_but_the_least_likely():
    logits = np.log(np.array([[0.4, 0.3, 0.2, 0.1]], np.float32))
    seeds, steps = np.array([1], np.uint64), np.array([0], np.int64)
    out = ref.apply_xtc(logits, np.array([0.15], np.float32), np.array([1.0], np.float32), seeds, steps)
    assert np.isneginf(out[0, :2]).all() and np.isfinite(out[0, 2:]).all()
    same = ref.apply_xtc(logits, np.array([0.35], np.float32), np.array([1.0], np.float32), seeds, steps)
    np.testing.assert_array_equal(same, logits)
    off = ref.apply_xtc(logits, np.array([0.6], np.float32), np.array([1.0], np.float32), seeds, steps)
    np.testing.assert_array_equal(off, logits)


def test_top_n_sigma_by_hand():
    logits = np.array([[4.0, 3.0, 0.0, -1.0, -6.0]], np.float32)
    std = float(logits.std())
    out = ref.apply_top_n_sigma(logits, np.array([1.0], np.float32))
    keep = logits[0] >= 4.0 - std
    assert np.isfinite(out[0, keep]).all() and np.isneginf(out[0, ~keep]).all()
    np.testing.assert_array_equal(ref.apply_top_n_sigma(logits, np.zeros(1, np.float32)), logits)


@pytest.mark.parametrize("n_sigma", [0.5, 1.0])
def test_top_n_sigma_frequencies(backend, n_sigma):
    rows = np.tile(LOGITS, (NUM, 1))
    filtered = _op(backend, "apply_top_n_sigma", rows, np.full(NUM, n_sigma, np.float32))
    probs = _softmax(ref.apply_top_n_sigma(LOGITS[None], np.array([n_sigma], np.float32))[0])
    _assert_follows(_sample_counts(backend, filtered), probs)


@pytest.mark.parametrize("probability", [1.0, 0.5])
def test_xtc_frequencies(backend, probability):
    rows = np.tile(LOGITS, (NUM, 1))
    seeds = np.arange(10_000, 10_000 + NUM, dtype=np.uint64)
    filtered = _op(backend, "apply_xtc", rows, np.full(NUM, 0.1, np.float32),
                   np.full(NUM, probability, np.float32), seeds, np.ones(NUM, np.int64))
    cut = _softmax(ref.apply_xtc(LOGITS[None], np.array([0.1], np.float32), np.array([1.0], np.float32),
                                 seeds[:1], np.ones(1, np.int64))[0])
    _assert_follows(_sample_counts(backend, filtered),
                    probability * cut + (1 - probability) * _softmax(LOGITS))


def test_dry_frequencies_with_top_k(backend):
    ctx = np.tile(np.array([0, 1, 2, 0, 1], np.int32), (NUM, 1))
    filtered = _op(backend, "apply_dry", np.tile(LOGITS, (NUM, 1)), ctx,
                   np.full(NUM, 0.8, np.float32), np.full(NUM, 1.75, np.float32),
                   np.full(NUM, 2, np.int32), np.full((NUM, 1), -1, np.int32))
    out = _op(backend, "sample", filtered, np.full(NUM, 0.9, np.float32), np.full(NUM, 4, np.int32),
              np.ones(NUM, np.float32), np.zeros(NUM, np.float32),
              np.arange(NUM, dtype=np.uint64), np.ones(NUM, np.int64))
    z = filtered[0] / 0.9
    probs = filter_probs(_softmax(z).astype(np.float32), 4, 1.0, 0.0)
    assert filtered[0, 2] == pytest.approx(LOGITS[2] - 0.8)
    _assert_follows(np.bincount(out, minlength=8), probs)


def _cycle_script(ctx):
    cycle = [5, 6, 7]
    return cycle[(cycle.index(ctx[-1]) + 1) % 3] if ctx[-1] in cycle else None


def _greedy_tokens(**params):
    engine = make_fake_engine(FakeCausalLM(_numpy(), script=_cycle_script))
    engine.add_request("r", [1, 5], SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True,
                                                   **params))
    return run_to_completion(engine)["r"].outputs[0].token_ids


def test_engine_dry_breaks_a_scripted_loop():
    assert _greedy_tokens() == [6, 7, 5] * 13 + [6]
    tokens = _greedy_tokens(dry_multiplier=1.0, dry_sequence_breaker_ids=[])
    assert tokens != [6, 7, 5] * 13 + [6]
    assert tokens[:8] == [6, 7, 5, 6, 7, 5, 6, 7]


def test_engine_top_n_sigma_and_xtc_run_in_the_sampler():
    engine = make_fake_engine(FakeCausalLM(_numpy()))
    engine.add_request("a", [3, 4], SamplingParams(temperature=1.0, max_tokens=12, seed=3,
                                                   top_n_sigma=0.01))
    engine.add_request("b", [3, 4], SamplingParams(temperature=0.0, max_tokens=12))
    out = run_to_completion(engine)
    assert out["a"].outputs[0].token_ids == out["b"].outputs[0].token_ids


class _HostOnlyOps:
    """An op table without the filter ops (a backend that implements none of them)."""

    def __init__(self, ops):
        self._ops = ops

    def __contains__(self, name):
        return not name.startswith("apply_") and name in self._ops

    def __getattr__(self, name):
        if name.startswith("apply_"):
            raise AttributeError(name)
        return getattr(self._ops, name)


class _Row:
    def __init__(self, params, tokens, seed=0):
        self.samples = True
        self.draft_ids = ()
        self.seq = type("Seq", (), {"params": params, "token_ids": tokens, "seed": seed})()


def test_backend_without_the_ops_gets_the_reference_on_the_host():
    be = _numpy()
    host_only = type("B", (), {"ops": _HostOnlyOps(be.ops), "from_host": staticmethod(be.from_host),
                               "to_host": staticmethod(be.to_host)})()
    rows = [_Row(SamplingParams(dry_multiplier=1.0, top_n_sigma=1.0), [1, 2, 3, 1, 2]),
            _Row(SamplingParams(), [1, 2, 3, 1, 2])]
    logits = np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)
    got = apply_logits_filters(host_only, logits, rows, np.zeros(2, np.int64))
    want = apply_logits_filters(be, logits, rows, np.zeros(2, np.int64))
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got[1], logits[1])
    assert got[0, 3] < logits[0, 3]


def test_breaker_strings_use_their_last_token():
    params = SamplingParams(dry_sequence_breakers=["ab", "\n"], dry_sequence_breaker_ids=[9])
    assert breaker_ids(params, lambda text: [ord(c) for c in text]) == [9, 10, 98]


@pytest.mark.parametrize("field,value", [("dry_multiplier", -1.0), ("dry_base", 0.5),
                                         ("dry_allowed_length", 0), ("xtc_threshold", 2.0),
                                         ("xtc_probability", 1.5), ("top_n_sigma", -3.0),
                                         ("dry_sequence_breakers", [""])])
def test_bad_values_name_the_field(field, value):
    with pytest.raises(ValueError, match=f"^{field} must be"):
        SamplingParams(**{field: value})


@pytest.mark.gpu
def test_cuda_filters_match_reference_and_sample_exactly():
    cuda = Registry().create("gpu_backends", "cuda")
    rows = [_Row(SamplingParams(dry_multiplier=0.8, xtc_probability=1.0, top_n_sigma=1.5),
                 [0, 1, 2, 0, 1], seed=7)] * 4
    logits = np.tile(LOGITS, (4, 1))
    got = cuda.to_host(apply_logits_filters(cuda, cuda.from_host(logits), rows, np.ones(4, np.int64)))
    np.testing.assert_array_equal(got, apply_logits_filters(_numpy(), logits, rows, np.ones(4, np.int64)))
    filtered = cuda.from_host(np.tile(got[0], (NUM, 1)))
    out = cuda.to_host(cuda.ops.sample(*(cuda.from_host(a) if isinstance(a, np.ndarray) else a for a in (
        filtered, np.ones(NUM, np.float32), np.zeros(NUM, np.int32), np.ones(NUM, np.float32),
        np.zeros(NUM, np.float32), np.arange(NUM, dtype=np.uint64), np.ones(NUM, np.int64)))))
    _assert_follows(np.bincount(np.asarray(out), minlength=8), _softmax(got[0]))
