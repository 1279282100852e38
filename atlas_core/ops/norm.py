"""Reference elementwise ops: embedding, RMSNorm, linear (alone and after RMSNorm), gated
activations, sigmoid gating."""

from __future__ import annotations

import sys

import numpy as np

from atlas_core.ops._dtypes import f32
from atlas_core.ops.quant import weight_f32


def embedding(ids: np.ndarray, table: np.ndarray) -> np.ndarray:
    """Gather rows of ``table``.

    Args:
        ids: ``[num_tokens]`` int32 token ids, each in ``[0, vocab_size)``.
        table: ``[vocab_size, hidden_size]``.

    Returns:
        ``[num_tokens, hidden_size]`` in ``table.dtype``.
    """
    return table[np.asarray(ids, dtype=np.int64)]


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float, residual: np.ndarray | None = None,
             *, zero_centered: bool = False):
    """RMSNorm over the last axis, optionally fused with the residual add.

    ``y = x / sqrt(mean(x**2) + eps) * w`` computed in float32, stored in ``x.dtype``. With
    ``zero_centered`` the stored weight is ``w - 1`` (Gemma / Qwen3.5), so ``y * (1 + w)``.

    Args:
        x: ``[..., hidden]``.
        weight: ``[hidden]``.
        eps: variance epsilon.
        residual: optional ``[..., hidden]``; when given, ``r = x + residual`` (rounded to
            ``x.dtype``) is normalised and returned as the new residual.

    Returns:
        ``y`` or, with ``residual``, the tuple ``(y, r)``.
    """
    dtype = x.dtype
    if residual is not None:
        x = (f32(x) + f32(residual)).astype(dtype)
    xf = f32(x)
    w = f32(weight) + 1.0 if zero_centered else f32(weight)
    y = xf / np.sqrt(np.mean(xf * xf, axis=-1, keepdims=True) + eps) * w
    y = y.astype(dtype)
    return (y, x) if residual is not None else y


def rms_norm_linear(x: np.ndarray, residual: np.ndarray | None, norm_weight: np.ndarray,
                    eps: float, weight: np.ndarray, bias: np.ndarray | None = None,
                    zero_centered: bool = False, activation: str | None = None):
    """A pre-norm and the projection after it as one op (backends may fuse them into one pass
    over ``weight``): ``linear(rms_norm(x, norm_weight, eps, residual), weight, bias)``.

    Rounds exactly as the separate ops do: the residual sum and the normed activations are
    stored in ``x.dtype`` before the projection reads them.

    Args:
        x: ``[..., in_features]``.
        residual: optional ``[..., in_features]`` added to ``x`` before the norm.
        norm_weight: ``[in_features]`` (stored as ``w - 1`` with ``zero_centered``).
        eps: variance epsilon.
        weight: ``[out_features, in_features]``.
        bias: optional ``[out_features]``.
        zero_centered: see :func:`rms_norm`.
        activation: ``None`` (plain projection) or ``"silu"`` / ``"gelu_tanh"``: then ``weight``
            is a gated MLP's ``[gate; up]`` and the op is :func:`linear_act_and_mul` of the normed
            input, ``[..., out_features // 2]``.

    Returns:
        ``(y, residual_out)``: ``y`` ``[..., out_features]`` in ``x.dtype`` and the new residual
        stream ``x + residual`` (``x`` itself when ``residual`` is ``None``).
    """
    return compose_rms_norm_linear(sys.modules[__name__], x, residual, norm_weight, eps, weight,
                                   bias, zero_centered, activation)


def compose_rms_norm_linear(ops, x, residual, norm_weight, eps, weight, bias=None,
                            zero_centered=False, activation=None):
    """:func:`rms_norm_linear` as the separate ops of ``ops`` (the references, or a backend's
    ``backend.ops``): ``rms_norm`` then ``linear`` / ``linear_act_and_mul``."""
    if residual is None:
        h, r = ops.rms_norm(x, norm_weight, eps, zero_centered=zero_centered), x
    else:
        h, r = ops.rms_norm(x, norm_weight, eps, residual, zero_centered=zero_centered)
    if activation is None:
        return ops.linear(h, weight, bias), r
    return ops.linear_act_and_mul(h, weight, bias, activation), r


def linear(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """``y = x @ weight.T + bias`` with float32 accumulation.

    Args:
        x: ``[..., in_features]``.
        weight: ``[out_features, in_features]`` (the HF / PyTorch layout), or a
            :class:`~atlas_core.ops.quant.QuantizedWeight` of that shape (computed with its
            exact float32 dequantization).
        bias: optional ``[out_features]``.

    Returns:
        ``[..., out_features]`` in ``x.dtype``.
    """
    y = f32(x) @ weight_f32(weight).T
    if bias is not None:
        y = y + f32(bias)
    return y.astype(x.dtype)


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(0.7978845608028654 * (x + 0.044715 * x ** 3)))


ACTIVATIONS = {"silu": _silu, "gelu_tanh": _gelu_tanh, "gelu_pytorch_tanh": _gelu_tanh}


def silu_and_mul(x: np.ndarray) -> np.ndarray:
    """``silu(x[..., :d]) * x[..., d:]`` for ``x`` of last size ``2d`` (gate then up)."""
    return act_and_mul(x, "silu")


def gelu_tanh_and_mul(x: np.ndarray) -> np.ndarray:
    """``gelu_tanh(x[..., :d]) * x[..., d:]`` for ``x`` of last size ``2d`` (gate then up)."""
    return act_and_mul(x, "gelu_tanh")


def act_and_mul(x: np.ndarray, activation: str) -> np.ndarray:
    """Gated activation by name (``silu`` or ``gelu_tanh``); see :func:`silu_and_mul`."""
    d = x.shape[-1] // 2
    xf = f32(x)
    return (ACTIVATIONS[activation](xf[..., :d]) * xf[..., d:]).astype(x.dtype)


def linear_act_and_mul(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None = None,
                       activation: str = "silu") -> np.ndarray:
    """A gated MLP's gate/up projection and activation as one op (backends may fuse them into
    one pass over the weight): ``act_and_mul(linear(x, weight, bias), activation)``.

    Args:
        x: ``[..., in_features]``.
        weight: ``[2 * d, in_features]``, the gate rows then the up rows.
        bias: optional ``[2 * d]``.
        activation: ``"silu"`` or ``"gelu_tanh"``.

    Returns:
        ``[..., d]`` in ``x.dtype``; the projection is rounded to ``x.dtype`` before the
        activation, exactly as the two separate ops do.
    """
    return act_and_mul(linear(x, weight, bias), activation)


def add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise ``a + b`` in float32, stored in ``a.dtype``."""
    return (f32(a) + f32(b)).astype(a.dtype)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def sigmoid_mul(x: np.ndarray, gate: np.ndarray) -> np.ndarray:
    """``x * sigmoid(gate)`` in float32, stored in ``x.dtype``.

    Serves the gated attention output (``gate`` ``[num_tokens, num_heads * head_dim]``) and the
    shared-expert gate (``gate`` ``[num_tokens, 1]``, broadcast along the last axis).

    Args:
        x: ``[num_tokens, d]``.
        gate: ``[num_tokens, d]`` or ``[num_tokens, 1]``.

    Returns:
        ``[num_tokens, d]`` in ``x.dtype``.
    """
    return (f32(x) * _sigmoid(f32(gate))).astype(x.dtype)
