"""The numpy backend's own op implementations: the references, made fast where it matters.

Each method has the signature and semantics of the reference of the same name; the
registrations in :mod:`atlas_core.backends.plugin` say which ops come from here, which from
the faster module functions (``numpy_attention``, ``numpy_sampling``), and the table falls back
to each op's unfused definition, else its reference, for the rest. Weights given to
:meth:`NumpyOps.linear` and :meth:`NumpyOps.moe_experts` are converted to float32 once and
cached (see :class:`~atlas_core.backends.numpy_convert.Float32Cache`); a
:class:`~atlas_core.ops.quant.QuantizedWeight` is dequantized exactly, once, the same way.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from atlas_core.backends.numpy_convert import to_f32
from atlas_core.backends.numpy_gemm import linear_f32, matmul_nt
from atlas_core.ops.norm import ACTIVATIONS


class NumpyOps:
    """Op implementations of :class:`~atlas_core.backends.numpy_backend.NumpyBackend`.

    Args:
        backend: the backend; its ``weight_cache`` (float32 weight copies, or ``None`` to
            convert on every call) serves the weight-reading ops.
    """

    def __init__(self, backend: Any) -> None:
        self.weight_cache = backend.weight_cache

    def _weight(self, w: np.ndarray) -> np.ndarray:
        return self.weight_cache.get(w) if self.weight_cache is not None else to_f32(w)

    def embedding(self, ids, table):
        return np.take(table, np.asarray(ids, dtype=np.int64), axis=0)

    def rms_norm(self, x, weight, eps, residual=None, *, zero_centered=False):
        dtype = x.dtype
        if residual is not None:
            x = (to_f32(x) + to_f32(residual)).astype(dtype)
        xf = to_f32(x)
        w = self._weight(weight)
        if zero_centered:
            w = w + np.float32(1.0)
        ms = np.einsum("...i,...i->...", xf, xf)[..., None] / np.float32(xf.shape[-1])
        y = (xf / np.sqrt(ms + np.float32(eps)) * w).astype(dtype, copy=False)
        return (y, x) if residual is not None else y

    def linear(self, x, weight, bias=None):
        y = linear_f32(to_f32(x), self._weight(weight))
        if bias is not None:
            y += to_f32(bias)
        return y.astype(x.dtype, copy=False)

    def linear_act_and_mul(self, x, weight, bias=None, activation="silu"):
        return self._act_and_mul(self.linear(x, weight, bias), activation)

    def add(self, a, b):
        return (to_f32(a) + to_f32(b)).astype(a.dtype, copy=False)

    def _act_and_mul(self, x, activation):
        d = x.shape[-1] // 2
        xf = to_f32(x)
        return (ACTIVATIONS[activation](xf[..., :d]) * xf[..., d:]).astype(x.dtype, copy=False)

    def silu_and_mul(self, x):
        return self._act_and_mul(x, "silu")

    def gelu_tanh_and_mul(self, x):
        return self._act_and_mul(x, "gelu_tanh")

    def moe_experts(self, x, w_gate_up, w_down, topk_weights, topk_ids, activation="silu"):
        act = ACTIVATIONS[activation]
        xf = to_f32(x)
        w1, w2 = self._weight(w_gate_up), self._weight(w_down)
        ids = np.asarray(topk_ids)
        weights = to_f32(np.asarray(topk_weights))
        out = np.zeros(x.shape, dtype=np.float32)
        inter = w2.shape[-1]
        for e in np.unique(ids):
            rows, slots = np.nonzero(ids == e)
            gate_up = matmul_nt(xf[rows], w1[e])
            h = act(gate_up[:, :inter]) * gate_up[:, inter:]
            np.add.at(out, rows, matmul_nt(h, w2[e]) * weights[rows, slots][:, None])
        return out.astype(x.dtype, copy=False)
