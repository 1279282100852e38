"""The Mamba-2 mixer of Nemotron-H (layer ``mamba2``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from atlas_core.api import (Module, RecurrentStateSpec, StepMetadata, TransformerLayer,
                            recurrent_verify, recurrent_verify_graph)


class Mamba2Mixer(Module, TransformerLayer):
    """in_proj -> causal conv1d -> selective scan -> gated group RMSNorm -> out_proj.

    Parameters (HF names): ``in_proj.weight`` ``[I + conv_dim + H, hidden]`` with rows
    ``[z (I), x B C (conv_dim), dt (H)]`` where ``I = num_heads * head_dim`` and
    ``conv_dim = I + 2 * n_groups * state_size``; ``conv1d.weight`` ``[conv_dim, K]`` (stored
    ``[conv_dim, 1, K]``) and ``conv1d.bias``; ``A_log``, ``D``, ``dt_bias`` ``[H]`` float32;
    ``norm.weight`` ``[I]``; ``out_proj.weight``.

    Prefill (any step with a multi-token sequence) runs ``mamba2_conv1d``,
    ``mamba2_ssd_chunked`` and ``mamba2_gated_norm``; decode steps ``mamba2_decode`` (conv
    update, state update and gated norm as one op). Per-sequence state lives in the slots
    ``meta.state_indices`` of the pools bound by :meth:`bind_state`. Speculative verify steps
    run ``mamba2_decode`` once a query position, each position's state in its own row
    (:meth:`_verify`), so rejected drafts roll back.

    Args:
        hidden_size: model width.
        num_heads, head_dim: ``mamba_num_heads``, ``mamba_head_dim``.
        n_groups, state_size: ``n_groups`` of B/C, ``ssm_state_size``.
        conv_kernel: depthwise conv width.
        chunk_size: SSD chunk length of prefill.
        time_step_limit: ``(dt_min, dt_max)`` clamp of the discretised time step.
        eps: epsilon of the gated norm (``layer_norm_epsilon``).
        use_conv_bias: ``conv1d.bias`` present.
        use_bias: biases on ``in_proj`` and ``out_proj``.
        hidden_act: conv activation (``silu``).
    """

    def __init__(self, *, hidden_size: int, num_heads: int, head_dim: int, n_groups: int,
                 state_size: int, conv_kernel: int = 4, chunk_size: int = 128,
                 time_step_limit: tuple[float, float] = (0.0, float("inf")), eps: float = 1e-5,
                 use_conv_bias: bool = True, use_bias: bool = False,
                 hidden_act: str = "silu") -> None:
        super().__init__()
        if num_heads % n_groups:
            raise ValueError(f"mamba_num_heads ({num_heads}) must be a multiple of n_groups "
                             f"({n_groups})")
        if hidden_act not in ("silu", "swish"):
            raise ValueError(f"unsupported mamba_hidden_act {hidden_act!r}; Mamba-2 uses silu")
        self.num_heads, self.head_dim = num_heads, head_dim
        self.n_groups, self.state_size = n_groups, state_size
        self.kernel_size, self.chunk_size, self.eps = conv_kernel, chunk_size, eps
        self.dt_min, self.dt_max = float(time_step_limit[0]), float(time_step_limit[1])
        self.inner = num_heads * head_dim
        self.conv_dim = self.inner + 2 * n_groups * state_size
        self.in_sizes = [self.inner, self.conv_dim, num_heads]
        rows = sum(self.in_sizes)
        self.declare("in_proj.weight", (rows, hidden_size), quantizable=False)
        if use_bias:
            self.declare("in_proj.bias", (rows,))
            self.declare("out_proj.bias", (hidden_size,))
        self.declare("conv1d.weight", (self.conv_dim, conv_kernel),
                     [("conv1d.weight", (self.conv_dim, 1, conv_kernel))])
        if use_conv_bias:
            self.declare("conv1d.bias", (self.conv_dim,))
        for name in ("A_log", "D", "dt_bias"):
            self.declare(name, (num_heads,), dtype=np.float32)
        self.declare("norm.weight", (self.inner,))
        self.declare("out_proj.weight", (hidden_size, self.inner))
        self.state: dict[str, Any] | None = None

    def state_spec(self) -> RecurrentStateSpec:
        return RecurrentStateSpec(shapes={
            "conv": (self.kernel_size - 1, self.conv_dim),
            "ssm": (self.num_heads, self.head_dim, self.state_size)}, dtype="float32",
            prefill_bytes_per_token=4 * (self.conv_dim + 2 * self.inner + self.num_heads),
            spec_verify=True)

    def bind_state(self, state: Any) -> None:
        """Receive the pools ``{"conv": [num_slots, K - 1, conv_dim],
        "ssm": [num_slots, H, head_dim, state_size]}`` (a dict, or a ``(conv, ssm)`` pair)."""
        self.state = dict(state) if isinstance(state, dict) else dict(zip(("conv", "ssm"), state))

    def forward(self, hidden: Any, residual: Any | None, meta: StepMetadata) -> tuple[Any, Any]:
        self._check_state()
        z, xbc, dt = self._project(hidden, None, None, 0.0)[0]
        return self._mix(z, xbc, dt, meta), residual

    def forward_prenorm(self, hidden: Any, residual: Any | None, norm_weight: Any, eps: float,
                        zero_centered: bool, meta: StepMetadata) -> tuple[Any, Any]:
        """The block's norm folded into ``in_proj`` (``ops.rms_norm_linear``)."""
        self._check_state()
        (z, xbc, dt), residual = self._project(hidden, residual, norm_weight, eps, zero_centered)
        return self._mix(z, xbc, dt, meta), residual

    def _check_state(self) -> None:
        if self.state is None:
            raise RuntimeError("mamba2 layer has no state pools; call model.bind_kv_caches() first")

    def _project(self, hidden: Any, residual: Any | None, norm_weight: Any | None, eps: float,
                 zero_centered: bool = False) -> tuple[list[Any], Any]:
        """``z``, ``xBC`` and ``dt`` of ``in_proj`` (over the normed stream when ``norm_weight``):
        one projection cut into views for a single token, one per row block otherwise."""
        ops, weight, bias = self.ops, self.params["in_proj.weight"], self.param("in_proj.bias")
        bounds = np.cumsum([0] + self.in_sizes).tolist()
        blocks = list(zip(bounds, bounds[1:]))
        if norm_weight is not None and hidden.shape[0] != 1:
            if residual is None:
                hidden, residual = ops.rms_norm(hidden, norm_weight, eps,
                                                zero_centered=zero_centered), hidden
            else:
                hidden, residual = ops.rms_norm(hidden, norm_weight, eps, residual,
                                                zero_centered=zero_centered)
            norm_weight = None
        if hidden.shape[0] != 1:
            return [ops.linear(hidden, weight[a:b], None if bias is None else bias[a:b])
                    for a, b in blocks], residual
        if norm_weight is None:
            row = ops.linear(hidden, weight, bias)
        else:
            row, residual = ops.rms_norm_linear(hidden, residual, norm_weight, eps, weight, bias,
                                                zero_centered)
        row = row.reshape(bounds[-1])
        return [row[a:b].reshape(1, b - a) for a, b in blocks], residual

    def _mix(self, z: Any, xbc: Any, dt: Any, meta: StepMetadata) -> Any:
        """Conv, scan, gated norm and ``out_proj`` of the projected inputs."""
        ops, p = self.ops, self.params
        conv_states, ssm_states = self.state["conv"], self.state["ssm"]
        sizes = dict(num_heads=self.num_heads, head_dim=self.head_dim, n_groups=self.n_groups,
                     state_size=self.state_size, dt_min=self.dt_min, dt_max=self.dt_max)
        if meta.spec_verify is not None or meta.spec_state_rows is not None:
            y = self._verify(z, xbc, dt, meta, sizes)
        elif meta.is_decode:
            # y: [num_seqs, num_heads * head_dim], conv + scan step + gated norm
            y = ops.mamba2_decode(xbc, z, dt, p["conv1d.weight"], self.param("conv1d.bias"),
                                  p["A_log"], p["dt_bias"], p["D"], p["norm.weight"],
                                  conv_states, ssm_states, meta.cu_seqlens_q, meta.seq_lens,
                                  meta.state_indices, **sizes, eps=self.eps)
        else:
            x = ops.mamba2_conv1d(xbc, p["conv1d.weight"], self.param("conv1d.bias"),
                                  conv_states, meta.cu_seqlens_q, meta.seq_lens,
                                  meta.state_indices)
            y = ops.mamba2_ssd_chunked(x, dt, p["A_log"], p["dt_bias"], p["D"], ssm_states,
                                       meta.cu_seqlens_q, meta.seq_lens, meta.state_indices,
                                       **sizes, chunk_size=self.chunk_size)
            y = ops.mamba2_gated_norm(y, z, p["norm.weight"], self.inner // self.n_groups,
                                      self.eps)
        return ops.linear(y, p["out_proj.weight"], self.param("out_proj.bias"))

    def _verify(self, z: Any, xbc: Any, dt: Any, meta: StepMetadata, sizes: dict) -> Any:
        """A speculative verify step: each query position runs ``mamba2_decode`` from the conv
        and SSM state its previous position left in its own row, so rejected drafts roll back
        by row choice, without recompute (core's ``recurrent_verify``; graph-replayed verify
        steps: ``recurrent_verify_graph``)."""
        ops, p = self.ops, self.params
        pools = [self.state["conv"], self.state["ssm"]]

        def step(rows, cu, seq_lens, state):
            return ops.mamba2_decode(ops.embedding(rows, xbc), ops.embedding(rows, z),
                                     ops.embedding(rows, dt), p["conv1d.weight"],
                                     self.param("conv1d.bias"), p["A_log"], p["dt_bias"], p["D"],
                                     p["norm.weight"], pools[0], pools[1], cu, seq_lens, state,
                                     **sizes, eps=self.eps)
        if meta.spec_verify is not None:
            return recurrent_verify_graph(ops, self.backend, meta, pools, step, self.inner,
                                          z.dtype, "mamba2")
        return recurrent_verify(ops, self.backend, meta, pools, step, self.inner, z.dtype)
