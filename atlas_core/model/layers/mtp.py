"""MTPHead: a multi-token-prediction module (DeepSeek-V3 shape, used by Qwen3.5 / Qwen3-Next,
Nemotron-3, MiniMax-M2): ``fc([norm(embed(token)); norm(hidden)])`` -> one decoder block ->
final norm, with the model's embedding table and ``lm_head``.

A family loader builds it over its own decoder block, attaches it as ``CausalLM.mtp`` (the
module tree names mirror the checkpoint: ``mtp.fc.weight``, ``mtp.layers.0.*`` ...), and the
engine's :class:`~atlas_core.engine.spec.mtp.MTPProposer` drafts with it.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from atlas_core.interfaces.metadata import StepMetadata
from atlas_core.model.params import Module


class MTPHead(Module):
    """One MTP block over the target's final hidden states.

    Parameters: ``fc.weight`` ``[hidden, 2 * hidden]`` (input: the normed embedding of the
    next token, then the normed hidden state), ``pre_fc_norm_embedding.weight``,
    ``pre_fc_norm_hidden.weight``, ``norm.weight`` ``[hidden]``, and the block's under
    ``layers.0``. (DeepSeek-V3 names the two input norms ``enorm`` / ``hnorm`` and the
    projection ``eh_proj``: pass them as ``names``.)

    Args:
        layer: the decoder block (a :class:`~atlas_core.model.layers.decoder.DecoderLayer` or
            any TransformerLayer with a paged-KV mixer).
        hidden_size: model width.
        rms_norm_eps: epsilon of the norms.
        zero_centered: norm weights are stored as ``w - 1`` (Qwen3.5 / Qwen3-Next).
        embed_tokens: ``() ->`` the model's embedding table (shared, not a parameter here).
        names: checkpoint names of ``fc``, ``pre_fc_norm_embedding``, ``pre_fc_norm_hidden``
            and ``norm``, when they differ.
    """

    def __init__(self, layer: Any, *, hidden_size: int, rms_norm_eps: float,
                 zero_centered: bool, embed_tokens: Callable[[], Any],
                 names: dict[str, str] | None = None) -> None:
        super().__init__()
        self.hidden_size, self.eps, self.zero_centered = hidden_size, rms_norm_eps, zero_centered
        self.embed_tokens = embed_tokens
        self.names = {k: k for k in ("fc", "pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm")}
        self.names.update(names or {})
        self.layer = self.add("layers.0", layer)
        self.declare(f"{self.names['fc']}.weight", (hidden_size, 2 * hidden_size),
                     quantizable=False)
        for key in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
            self.declare(f"{self.names[key]}.weight", (hidden_size,))
        self.fc_embedding: Any = None
        self.fc_hidden: Any = None

    def post_load(self) -> None:
        """Split ``fc`` into its embedding and hidden halves (two GEMMs instead of a concat)."""
        host = self.backend.to_host(self.params[f"{self.names['fc']}.weight"])
        h = self.hidden_size
        self.fc_embedding = self.backend.from_host(np.ascontiguousarray(host[:, :h]))
        self.fc_hidden = self.backend.from_host(np.ascontiguousarray(host[:, h:]))

    def state_spec(self) -> Any:
        """The paged KV of the block's attention."""
        return self.layer.state_spec()

    def bind_state(self, state: Any) -> None:
        """Receive the block's KV pool."""
        self.layer.bind_state(state)

    def forward(self, input_ids: Any, hidden: Any, meta: StepMetadata) -> Any:
        """Final-normed head output ``[num_tokens, hidden_size]``.

        Args:
            input_ids: device int32 ``[num_tokens]``, the token after each position.
            hidden: ``[num_tokens, hidden_size]``, the target's final hidden state there (or
                the head's own output, when chaining drafts).
            meta: the layout of these positions (the block's attention reads its own KV).
        """
        ops, p, n, zc = self.ops, self.params, self.names, self.zero_centered
        embedded = ops.rms_norm(ops.embedding(input_ids, self.embed_tokens()),
                                p[f"{n['pre_fc_norm_embedding']}.weight"], self.eps,
                                zero_centered=zc)
        hidden = ops.rms_norm(hidden, p[f"{n['pre_fc_norm_hidden']}.weight"], self.eps,
                              zero_centered=zc)
        x = ops.add(ops.linear(embedded, self.fc_embedding), ops.linear(hidden, self.fc_hidden))
        x, residual = self.layer.forward(x, None, meta)
        out, _ = ops.rms_norm(x, p[f"{n['norm']}.weight"], self.eps, residual, zero_centered=zc)
        return out
