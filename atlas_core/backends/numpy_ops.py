"""The op table of the numpy backend: the references, made fast where it matters.

Every method has the signature and semantics of the function of the same name in
:mod:`atlas_core.ops.reference`. Weights given to :meth:`NumpyOps.linear` and
:meth:`NumpyOps.moe_experts` are converted to float32 once and cached (see
:class:`~atlas_core.backends.numpy_convert.Float32Cache`).
"""

from __future__ import annotations

import numpy as np

from atlas_core.backends import numpy_attention, numpy_gdn, numpy_sampling
from atlas_core.backends.numpy_convert import Float32Cache, to_f32
from atlas_core.backends.numpy_gemm import linear_f32, matmul_nt
from atlas_core.ops import OP_NAMES, reference
from atlas_core.ops.attention import compose_qk_norm_rope_and_cache, compose_rope_cache_attention
from atlas_core.ops.gdn import compose_gdn_decode
from atlas_core.ops.moe import compose_moe_block, compose_rms_norm_moe_block
from atlas_core.ops.norm import ACTIVATIONS, compose_rms_norm_linear


class NumpyOps:
    """``backend.ops`` of :class:`~atlas_core.backends.numpy_backend.NumpyBackend`.

    Args:
        weight_cache: cache of float32 weight copies, or ``None`` to convert on every call.
    """

    def __init__(self, weight_cache: Float32Cache | None = None) -> None:
        self.weight_cache = weight_cache

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

    def rms_norm_linear(self, x, residual, norm_weight, eps, weight, bias=None,
                        zero_centered=False, activation=None):
        return compose_rms_norm_linear(self, x, residual, norm_weight, eps, weight, bias,
                                       zero_centered, activation)

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

    def rotary_embedding(self, q, k, positions, cos_sin_cache, rotary_dim=None, is_neox=True):
        return reference.rotary_embedding(q, k, positions, cos_sin_cache, rotary_dim, is_neox)

    def reshape_and_cache(self, k, v, k_cache, v_cache, slot_mapping, kv_scale=1.0):
        reference.reshape_and_cache(k, v, k_cache, v_cache, slot_mapping, kv_scale)

    def prefill_attention(self, q, k, v, cu_seqlens, scale):
        return numpy_attention.prefill_attention(q, k, v, cu_seqlens, scale)

    def paged_attention(self, q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, scale,
                        kv_scale=1.0):
        return numpy_attention.paged_attention(q, k_cache, v_cache, block_tables, seq_lens,
                                               cu_seqlens_q, scale, kv_scale)

    def qk_norm_rope_and_cache(self, qkv, positions, cos_sin_cache, k_cache, v_cache, slot_mapping,
                               *, num_heads, num_kv_heads, head_dim, q_norm=None, k_norm=None,
                               eps=1e-6, rotary_dim=None, is_neox=True, kv_scale=1.0):
        return compose_qk_norm_rope_and_cache(
            self, qkv, positions, cos_sin_cache, k_cache, v_cache, slot_mapping,
            num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim, q_norm=q_norm,
            k_norm=k_norm, eps=eps, rotary_dim=rotary_dim, is_neox=is_neox, kv_scale=kv_scale)

    def rope_cache_attention(self, qkv, positions, cos_sin_cache, k_cache, v_cache, slot_mapping,
                             block_tables, seq_lens, cu_seqlens_q, scale, kv_scale=1.0, *,
                             num_heads, num_kv_heads, head_dim, q_norm=None, k_norm=None,
                             eps=1e-6, rotary_dim=None, is_neox=True):
        return compose_rope_cache_attention(
            self, qkv, positions, cos_sin_cache, k_cache, v_cache, slot_mapping, block_tables,
            seq_lens, cu_seqlens_q, scale, kv_scale, num_heads=num_heads,
            num_kv_heads=num_kv_heads, head_dim=head_dim, q_norm=q_norm, k_norm=k_norm, eps=eps,
            rotary_dim=rotary_dim, is_neox=is_neox)

    def moe_route(self, router_logits, top_k, renormalize, scoring="softmax"):
        return reference.moe_route(router_logits, top_k, renormalize, scoring)

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

    def moe_block(self, x, router_weight, w_gate_up, w_down, top_k, renormalize,
                  scoring="softmax", activation="silu", shared_gate_up=None, shared_down=None,
                  shared_gate=None):
        return compose_moe_block(self, x, router_weight, w_gate_up, w_down, top_k, renormalize,
                                 scoring, activation, shared_gate_up, shared_down, shared_gate)

    def rms_norm_moe_block(self, x, residual, norm_weight, eps, zero_centered, router_weight,
                           w_gate_up, w_down, top_k, renormalize, scoring="softmax",
                           activation="silu", shared_gate_up=None, shared_down=None,
                           shared_gate=None):
        return compose_rms_norm_moe_block(self, x, residual, norm_weight, eps, zero_centered,
                                          router_weight, w_gate_up, w_down, top_k, renormalize,
                                          scoring, activation, shared_gate_up, shared_down,
                                          shared_gate)

    def gated_delta_rule_chunked(self, qkv, g, beta, ssm_states, cu_seqlens, seq_lens,
                                 state_indices, *, num_k_heads, num_v_heads, head_k_dim,
                                 head_v_dim, scale=None, use_qk_l2norm=True, chunk_size=64):
        return numpy_gdn.gated_delta_rule(
            qkv, g, beta, ssm_states, cu_seqlens, seq_lens, state_indices,
            num_k_heads=num_k_heads, num_v_heads=num_v_heads, head_k_dim=head_k_dim,
            head_v_dim=head_v_dim, scale=scale, use_qk_l2norm=use_qk_l2norm)

    def gated_delta_rule_recurrent(self, qkv, g, beta, ssm_states, cu_seqlens, seq_lens,
                                   state_indices, *, num_k_heads, num_v_heads, head_k_dim,
                                   head_v_dim, scale=None, use_qk_l2norm=True):
        return numpy_gdn.gated_delta_rule(
            qkv, g, beta, ssm_states, cu_seqlens, seq_lens, state_indices,
            num_k_heads=num_k_heads, num_v_heads=num_v_heads, head_k_dim=head_k_dim,
            head_v_dim=head_v_dim, scale=scale, use_qk_l2norm=use_qk_l2norm)

    def gated_delta_rule_decode(self, qkv, z, ba, conv_weight, A_log, dt_bias, norm_weight,
                                conv_states, ssm_states, cu_seqlens, seq_lens, state_indices, *,
                                num_k_heads, num_v_heads, head_k_dim, head_v_dim, eps=1e-6):
        return compose_gdn_decode(self, qkv, z, ba, conv_weight, A_log, dt_bias, norm_weight,
                                  conv_states, ssm_states, cu_seqlens, seq_lens, state_indices,
                                  num_k_heads=num_k_heads, num_v_heads=num_v_heads,
                                  head_k_dim=head_k_dim, head_v_dim=head_v_dim, eps=eps)

    def argmax(self, logits):
        return numpy_sampling.argmax(logits)

    def log_softmax(self, logits):
        return reference.log_softmax(logits)

    def topk(self, x, k):
        return numpy_sampling.topk(x, k)

    def apply_penalties(self, logits, prompt_ids, output_ids, repetition_penalty, presence_penalty,
                        frequency_penalty):
        return numpy_sampling.apply_penalties(logits, prompt_ids, output_ids, repetition_penalty,
                                              presence_penalty, frequency_penalty)

    def sample(self, logits, temperature, top_k, top_p, min_p, seeds, steps):
        return numpy_sampling.sample(logits, temperature, top_k, top_p, min_p, seeds, steps)


def _adopt_references() -> None:
    # Ops without a faster version above run their reference as is (recurrent-layer ops, and any
    # op added to OP_NAMES later), so the numpy backend always provides the whole contract.
    for name in OP_NAMES:
        if not hasattr(NumpyOps, name):
            setattr(NumpyOps, name, staticmethod(getattr(reference, name)))


_adopt_references()
