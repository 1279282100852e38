"""Gated DeltaNet linear attention (layer ``gated_deltanet``), as in Qwen3-Next and Qwen3.5."""

from __future__ import annotations

from typing import Any

import numpy as np

from atlas_core.api import Module, RecurrentStateSpec, StepMetadata, TransformerLayer
from atlas_qwen35.projections import norm_project_blocks, project_blocks
from atlas_qwen35.spec_verify import gdn_verify, gdn_verify_graph

#: Checkpoint layouts of the input projections.
LAYOUTS = ("qwen3_5", "qwen3_next")


class GatedDeltaNet(Module, TransformerLayer):
    """in_proj -> causal conv1d -> gated delta rule -> gated RMSNorm -> out_proj.

    Parameters: ``in_proj.weight`` ``[2 * key_dim + 2 * value_dim + 2 * num_v_heads, hidden]``
    with rows ``[q heads, k heads, v heads, z heads, b, a]`` (one GEMV projects a decode token);
    ``conv1d.weight`` ``[conv_dim, kernel]``; ``A_log`` and ``dt_bias`` ``[num_v_heads]``
    float32; ``norm.weight`` ``[head_v_dim]``; ``out_proj.weight``. Qwen3.5 checkpoints store
    ``in_proj_qkv``/``in_proj_z``/``in_proj_b``/``in_proj_a``, packed here by declaration;
    Qwen3-Next stores ``in_proj_qkvz``/``in_proj_ba`` grouped per key head, packed the same way
    and reordered by :meth:`post_load`.

    Prefill (any batch with a multi-token sequence) runs ``causal_conv1d`` and
    ``gated_delta_rule_chunked``; decode steps ``gated_delta_rule_decode`` (conv update, gating,
    recurrent step and gated norm as one op). Per-sequence state lives in the slots
    ``meta.state_indices`` of the pools bound by :meth:`bind_state`. Speculative verify steps
    (``meta.spec_state_rows``) run :func:`~atlas_qwen35.spec_verify.gdn_verify`: the decode op
    per position, each position's state in its own row.

    Args:
        hidden_size: model width.
        num_k_heads, num_v_heads: key/query heads and value heads (a multiple of them).
        head_k_dim, head_v_dim: per-head sizes.
        conv_kernel_size: causal conv width (``linear_conv_kernel_dim``).
        rms_norm_eps: epsilon of the gated norm.
        hidden_act: conv activation (``silu``).
        layout: ``"qwen3_5"`` (split projections) or ``"qwen3_next"`` (grouped ``qkvz``/``ba``).
        chunk_size: chunk length of the prefill form.
    """

    def __init__(self, *, hidden_size: int, num_k_heads: int, num_v_heads: int, head_k_dim: int,
                 head_v_dim: int, conv_kernel_size: int = 4, rms_norm_eps: float = 1e-6,
                 hidden_act: str = "silu", layout: str = "qwen3_5", chunk_size: int = 64) -> None:
        super().__init__()
        if num_v_heads % num_k_heads:
            raise ValueError(f"linear_num_value_heads ({num_v_heads}) must be a multiple of "
                             f"linear_num_key_heads ({num_k_heads})")
        if layout not in LAYOUTS:
            raise ValueError(f"unknown Gated DeltaNet layout {layout!r}; use one of {LAYOUTS}")
        if hidden_act not in ("silu", "swish"):
            raise ValueError(f"unsupported hidden_act {hidden_act!r} for Gated DeltaNet; use silu")
        self.num_k_heads, self.num_v_heads = num_k_heads, num_v_heads
        self.head_k_dim, self.head_v_dim = head_k_dim, head_v_dim
        self.key_dim, self.value_dim = num_k_heads * head_k_dim, num_v_heads * head_v_dim
        self.conv_dim = 2 * self.key_dim + self.value_dim
        self.kernel_size, self.eps, self.layout, self.chunk_size = (
            conv_kernel_size, rms_norm_eps, layout, chunk_size)
        self.in_sizes = [self.conv_dim, self.value_dim, 2 * num_v_heads]
        self._declare(hidden_size)
        self.state: dict[str, Any] | None = None

    def _declare(self, hidden: int) -> None:
        nv, qkvz_rows = self.num_v_heads, self.conv_dim + self.value_dim
        if self.layout == "qwen3_5":
            qkvz = [("in_proj_qkv.weight", (self.conv_dim, hidden)),
                    ("in_proj_z.weight", (self.value_dim, hidden))]
            ba = [("in_proj_b.weight", (nv, hidden)), ("in_proj_a.weight", (nv, hidden))]
        else:
            qkvz = [("in_proj_qkvz.weight", (qkvz_rows, hidden))]
            ba = [("in_proj_ba.weight", (2 * nv, hidden))]
        self.declare("in_proj.weight", (qkvz_rows + 2 * nv, hidden), qkvz + ba,
                     quantizable=self.layout == "qwen3_5")
        self.declare("conv1d.weight", (self.conv_dim, self.kernel_size),
                     [("conv1d.weight", (self.conv_dim, 1, self.kernel_size))])
        self.declare("A_log", (nv,), dtype=np.float32)
        self.declare("dt_bias", (nv,), dtype=np.float32)
        self.declare("norm.weight", (self.head_v_dim,))
        self.declare("out_proj.weight", (hidden, self.value_dim))

    def post_load(self) -> None:
        """Reorder Qwen3-Next's per-key-head ``[q k v z]`` / ``[b a]`` rows into head-major blocks."""
        if self.layout != "qwen3_next":
            return
        nk, r = self.num_k_heads, self.num_v_heads // self.num_k_heads
        dk, dv = self.head_k_dim, self.head_v_dim
        weight, qkvz_rows = self.params["in_proj.weight"], self.conv_dim + self.value_dim
        self._permute(weight[:qkvz_rows], nk, [dk, dk, r * dv, r * dv])
        self._permute(weight[qkvz_rows:], nk, [r, r])

    def _permute(self, param: Any, groups: int, sizes: list[int]) -> None:
        """Rows of ``param`` (a row range of a parameter) from ``groups`` x ``sizes`` blocks to
        one block per size, in place."""
        host = self.backend.to_host(param)
        blocks = host.reshape(groups, sum(sizes), -1)
        bounds = np.cumsum([0] + sizes)
        parts = [blocks[:, bounds[i]:bounds[i + 1]].reshape(-1, host.shape[-1])
                 for i in range(len(sizes))]
        self.backend.copy_from_host(param, np.ascontiguousarray(np.concatenate(parts, axis=0)))

    def state_spec(self) -> RecurrentStateSpec:
        # chunked prefill work per token and value head, float32: W, G Q and decayed K rows
        # (3 x head_k_dim), U (head_v_dim), a 64-wide row of the chunk's Q K^T and the decay
        per_token = self.num_v_heads * (3 * self.head_k_dim + self.head_v_dim + 64 + 1) * 4
        return RecurrentStateSpec(shapes={
            "conv": (self.kernel_size - 1, self.conv_dim),
            "ssm": (self.num_v_heads, self.head_k_dim, self.head_v_dim)}, dtype="float32",
            prefill_bytes_per_token=per_token, spec_verify=True)

    def bind_state(self, state: Any) -> None:
        """Receive the pools ``{"conv": [num_slots, K - 1, conv_dim], "ssm": [num_slots, Hv, Dk, Dv]}``
        (a dict, or a ``(conv, ssm)`` pair)."""
        self.state = dict(state) if isinstance(state, dict) else dict(zip(("conv", "ssm"), state))

    def forward(self, hidden: Any, residual: Any | None, meta: StepMetadata) -> tuple[Any, Any]:
        self._check_state()
        qkv, z, ba = project_blocks(self.ops, hidden, self.params["in_proj.weight"],
                                    self.in_sizes)
        return self._mix(qkv, z, ba, meta), residual

    def forward_prenorm(self, hidden: Any, residual: Any | None, norm_weight: Any, eps: float,
                        zero_centered: bool, meta: StepMetadata) -> tuple[Any, Any]:
        """The decoder's input norm folded into ``in_proj`` (one ``rms_norm_linear`` for a decode
        token); see :class:`~atlas_core.model.layers.decoder.DecoderLayer`."""
        self._check_state()
        (qkv, z, ba), residual = norm_project_blocks(
            self.ops, hidden, residual, norm_weight, eps, zero_centered,
            self.params["in_proj.weight"], self.in_sizes)
        return self._mix(qkv, z, ba, meta), residual

    def _check_state(self) -> None:
        if self.state is None:
            raise RuntimeError("gated_deltanet layer has no state pools; call "
                               "model.bind_kv_caches() first")

    def _mix(self, qkv: Any, z: Any, ba: Any, meta: StepMetadata) -> Any:
        """Conv, gated delta rule, gated norm and ``out_proj`` of the projected inputs."""
        ops, p = self.ops, self.params
        conv_states, ssm_states = self.state["conv"], self.state["ssm"]
        heads = dict(num_k_heads=self.num_k_heads, num_v_heads=self.num_v_heads,
                     head_k_dim=self.head_k_dim, head_v_dim=self.head_v_dim)
        t = meta.num_tokens
        if meta.spec_verify is not None:
            core = gdn_verify_graph(self, qkv, z, ba, meta)
        elif meta.spec_state_rows is not None:
            core = gdn_verify(self, qkv, z, ba, meta)
        elif meta.is_decode:
            # core: [num_tokens, num_v_heads, head_v_dim], conv + gating + recurrence + norm
            core = ops.gated_delta_rule_decode(qkv, z, ba, p["conv1d.weight"], p["A_log"],
                                               p["dt_bias"], p["norm.weight"], conv_states,
                                               ssm_states, meta.cu_seqlens_q, meta.seq_lens,
                                               meta.state_indices, **heads, eps=self.eps)
        else:
            g, beta = ops.gdn_gating(ba, p["A_log"], p["dt_bias"])
            x = ops.causal_conv1d(qkv, p["conv1d.weight"], None, conv_states, meta.cu_seqlens_q,
                                  meta.seq_lens, meta.state_indices)
            core = ops.gated_delta_rule_chunked(x, g, beta, ssm_states, meta.cu_seqlens_q,
                                                meta.seq_lens, meta.state_indices,
                                                chunk_size=self.chunk_size, **heads)
            core = ops.rms_norm_gated(core, z.reshape(t, self.num_v_heads, self.head_v_dim),
                                      p["norm.weight"], self.eps)
        return ops.linear(core.reshape(t, self.value_dim), p["out_proj.weight"])
