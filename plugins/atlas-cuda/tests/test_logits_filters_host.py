"""The cuda logits filters' launches and argument checks, on a fake context (no GPU)."""

from __future__ import annotations

import numpy as np
import pytest

from atlas_cuda.ops_logits_filters import THREADS, LogitsFilterOps

from fake_context import FakeArray, fake_context


def _ops():
    ctx = fake_context()
    return LogitsFilterOps(ctx), ctx.kernels.launches


def _a(shape, dtype):
    return FakeArray(shape, dtype)


def test_dry_launches_a_block_per_row_with_its_scratch():
    ops, launches = _ops()
    logits = _a((3, 50), np.float32)
    out = ops.apply_dry(logits, _a((3, 12), np.int32), _a((3,), np.float32),
                        _a((3,), np.float32), _a((3,), np.int32), _a((3, 5), np.int32))
    (name, grid, _, args, _), = launches
    assert name == "apply_dry_f32" and grid == 3
    assert args[0] is out and out.shape == (3, 50) and out.dtype == np.float32
    assert args[1].shape == (3, 50) and args[1].dtype == np.int32
    assert args[2] is logits and args[4] == 12 and args[9] == 5 and args[10] == 50


def test_xtc_and_top_n_sigma_launch_one_block_per_row():
    ops, launches = _ops()
    logits = _a((4, 7), np.float32)
    ops.apply_xtc(logits, _a((4,), np.float32), _a((4,), np.float32), _a((4,), np.uint64),
                  _a((4,), np.int64))
    ops.apply_top_n_sigma(logits, _a((4,), np.float32))
    assert [(n, g, a[-1]) for n, g, _, a, _ in launches] == [
        ("apply_xtc_f32", 4, 7), ("apply_top_n_sigma_f32", 4, 7)]
    assert THREADS % 32 == 0


def test_no_rows_launch_nothing():
    ops, launches = _ops()
    out = ops.apply_top_n_sigma(_a((0, 9), np.float32), _a((0,), np.float32))
    assert out.shape == (0, 9) and not launches


@pytest.mark.parametrize("steps,error", [(_a((4,), np.int32), "steps must be int64"),
                                         (_a((3,), np.int64), "steps has shape")])
def test_xtc_refuses_arguments_the_kernel_would_misread(steps, error):
    ops, _ = _ops()
    with pytest.raises((TypeError, ValueError), match=error):
        ops.apply_xtc(_a((4, 7), np.float32), _a((4,), np.float32), _a((4,), np.float32),
                      _a((4,), np.uint64), steps)


def test_dry_refuses_flat_context():
    ops, _ = _ops()
    with pytest.raises(ValueError, match="token_ids"):
        ops.apply_dry(_a((2, 8), np.float32), _a((2,), np.int32), _a((2,), np.float32),
                      _a((2,), np.float32), _a((2,), np.int32), _a((2, 1), np.int32))
