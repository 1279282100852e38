"""The nvfp4 KV-row reference (atlas_core.ops.kv_quant) against an element-by-element statement
of its rule: every e2m1 code and tie, e4m3 scales from subnormal to saturated, zero groups."""

import numpy as np
import pytest

from atlas_core.ops._dtypes import float8_e4m3fn
from atlas_core.ops.kv_quant import (check_nvfp4_head_dim, dequantize_kv_nvfp4, nvfp4_head_dim,
                                     nvfp4_row_bytes, quantize_kv_nvfp4)

GRID = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def e4m3(v: float) -> float:
    return float(np.float32(v).astype(float8_e4m3fn).astype(np.float32))


def quantize_one(group: list[float]) -> tuple[list[int], float]:
    """The rule stated in the module docstring, one element at a time in Python floats
    (float32 arithmetic where the rule says so)."""
    amax = max((abs(x) for x in group if x == x), default=0.0)
    scale = e4m3(min(float(np.float32(amax) / np.float32(6)), 448.0))
    codes = []
    for x in group:
        if scale == 0 or x != x:
            idx = 0
        else:
            q = float(np.float32(abs(x)) / np.float32(scale))
            # nearest grid point; on a tie the even index
            dist = [abs(q - g) for g in GRID]
            best = min(dist)
            cands = [i for i, d in enumerate(dist) if d == best]
            idx = next((i for i in cands if i % 2 == 0), cands[0])
        codes.append(idx + 8 if scale != 0 and x < 0 else idx)
    return codes, scale


def pack_row(groups: list[list[float]]) -> np.ndarray:
    codes, scales = [], []
    for g in groups:
        c, s = quantize_one(g)
        codes += c
        scales.append(s)
    nibbles = np.array(codes, np.uint8)
    packed = nibbles[0::2] | (nibbles[1::2] << 4)
    return np.concatenate([packed, np.array(scales, np.float32).astype(float8_e4m3fn)
                           .view(np.uint8)])


def test_row_layout_sizes():
    assert nvfp4_row_bytes(128) == 72 and nvfp4_row_bytes(64) == 36
    assert nvfp4_head_dim(72) == 128 and nvfp4_head_dim(144) == 256
    with pytest.raises(ValueError, match="not an nvfp4 KV row"):
        nvfp4_head_dim(70)
    with pytest.raises(ValueError, match="head_dim 80 is not a multiple of 32.*fp8"):
        check_nvfp4_head_dim(80, "layer 3")


def test_every_code_and_every_tie():
    # scale 1 (amax 6): the group spans the whole grid, its midpoints and their neighbours
    values = [6.0, 0.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0.2499, 0.7501, 1.2501, 1.7499,
              2.5001, 3.4999, 5.0001]
    packed = quantize_kv_nvfp4(np.array(values, np.float32))
    want_idx = [7, 0, 0, 2, 2, 4, 4, 6, 6, 0, 2, 3, 3, 5, 5, 7]
    codes = np.stack([packed[:8] & 0xF, packed[:8] >> 4], -1).reshape(-1)
    assert codes.tolist() == want_idx
    assert packed[8] == np.float32(1).astype(float8_e4m3fn).view(np.uint8)
    neg = quantize_kv_nvfp4(-np.array(values, np.float32))
    neg_codes = np.stack([neg[:8] & 0xF, neg[:8] >> 4], -1).reshape(-1)
    # -0.0 keeps no sign bit (x < 0 is false), every other element gets code + 8
    assert neg_codes.tolist() == [i + 8 if v != 0 else 0 for i, v in zip(want_idx, values)]
    back = dequantize_kv_nvfp4(packed)
    assert back.tolist() == [GRID[i] for i in want_idx]


@pytest.mark.parametrize("amax", [6.0, 5.0, 1e-2, 3e-3, 1.2e-2 / 6, 6 * 2.0 ** -10, 1e-5, 0.0,
                                  2688.0, 1e6, 448 * 6 * 1.03])
def test_scales_from_subnormal_to_saturated(amax):
    rng = np.random.default_rng(int(amax * 1000) % 2 ** 32)
    group = (rng.uniform(-1, 1, 16) * amax).astype(np.float32)
    group[3] = amax
    packed = quantize_kv_nvfp4(group)
    assert packed.tobytes() == pack_row([group.tolist()]).tobytes()
    scale = float(packed[8:9].view(float8_e4m3fn).astype(np.float32)[0])
    assert scale == e4m3(min(amax / 6, 448.0))
    if scale == 0:
        assert not (packed[:8] & 0x77).any()  # magnitudes all zero
    else:
        back = dequantize_kv_nvfp4(packed)
        assert np.all(np.abs(back) <= 6 * scale)


def test_random_rows_match_the_statement():
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((40, 64)) * np.exp(rng.uniform(-8, 6, (40, 1)))).astype(np.float32)
    x[5, :16] = 0.0
    x[6, 16:32] = -0.0
    x[7, 3] = np.nan
    packed = quantize_kv_nvfp4(x)
    assert packed.shape == (40, 36) and packed.dtype == np.uint8
    for r in range(40):
        want = pack_row([x[r, g:g + 16].tolist() for g in range(0, 64, 16)])
        assert packed[r].tobytes() == want.tobytes(), f"row {r}"
    # zero groups: scale byte 0 and codes 0
    assert not packed[5, :8].any() and packed[5, 32] == 0
    back = dequantize_kv_nvfp4(packed)
    finite = ~np.isnan(x).any(axis=1)
    rel = np.linalg.norm(back[finite] - x[finite]) / np.linalg.norm(x[finite])
    assert rel < 0.12


def test_reshape_and_cache_and_gather_use_the_packed_rows():
    from atlas_core.ops.attention import gather_kv, reshape_and_cache
    rng = np.random.default_rng(3)
    k = rng.standard_normal((5, 2, 64)).astype(np.float32)
    v = rng.standard_normal((5, 2, 64)).astype(np.float32)
    kc = np.zeros((2, 4, 2, 36), np.uint8)
    vc = np.zeros_like(kc)
    slots = np.array([0, 1, 2, 3, 4], np.int32)
    reshape_and_cache(k, v, kc, vc, slots)
    assert np.array_equal(kc.reshape(8, 2, 36)[:5], quantize_kv_nvfp4(k))
    got = gather_kv(kc, np.array([0, 1]), 5)
    assert np.array_equal(got, dequantize_kv_nvfp4(quantize_kv_nvfp4(k)))
