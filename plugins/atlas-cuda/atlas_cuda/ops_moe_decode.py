"""The per-pair expert GEMVs of ``kernels/cuda/common/moe_decode.cu`` (gate_up, then down) for
``moe_experts`` at decode and for ``moe_block``'s fused path of 2-8 tokens, and the choice of
the one-token down kernel (policy ``moe_down``). Bound once per context
(``ctx.bind(MoeDecodeOps)``): it keeps the down kernels' occupancy."""

from __future__ import annotations

import numpy as np

from atlas_cuda.array import DeviceArray
from atlas_cuda.context import OpContext
from atlas_cuda.kernels_loader import variant_of

#: Most tokens the fused path serves (the router kernel keeps one accumulator per token); the
#: down kernel asks L2 for its expert rows before the PDL wait up to this many.
FUSED_MAX_TOKENS = 8
#: Output rows a warp of ``moe_dec_down_rows`` (``MOE_DOWN_ROWS`` in moe_decode.cu), and the
#: most shared memory its staged h may take (two blocks an SM).
DOWN_ROWS, DOWN_ROWS_MAX_SHMEM = 2, 96 * 1024


class MoeDecodeOps:
    """``moe_decode.cu``'s expert kernels on one context.

    Args:
        ctx: the backend's :class:`~atlas_cuda.context.OpContext`.
    """

    def __init__(self, ctx: OpContext) -> None:
        self.ctx = ctx
        self._down_occupancy: dict[str, int] = {}

    def experts(self, x, w_gate_up, w_down, weights, ids, shared_gate_up, shared_down,
                shared_w, gelu) -> DeviceArray:
        """``moe_decode.cu``'s per-pair gate_up and down GEMVs; both skip the (token, slot)
        pairs of weight 0 (no bytes read for them)."""
        t, hidden = x.shape
        inter, k = w_down.shape[-1], ids.shape[-1]
        s_inter = 0 if shared_down is None else shared_down.shape[-1]
        h = self.ctx.out((t * k, inter), np.float32)
        hs = self.ctx.out((t, s_inter), np.float32) if s_inter else None
        out = self.ctx.out(x.shape, x.dtype)
        launch, v = self.ctx.launch, variant_of(x.dtype)
        launch(self.ctx.kernels.kernel("moe_decode", v, f"moe_dec_gate_up_{v}"),
               (-(-max(inter, s_inter) // 8), t * k + (t if s_inter else 0)), 256, h, hs, x,
               w_gate_up, shared_gate_up, ids, weights, t, k, hidden, inter, s_inter, gelu,
               pdl=self.ctx.pdl)
        name = self.down_kernel(t, k, inter, hidden, v, s_inter)
        rows, shmem = 8, 0
        if name.startswith("moe_dec_down_rows"):
            rows, shmem = 8 * DOWN_ROWS, 4 * (k * inter + s_inter)
        launch(self.ctx.kernels.kernel("moe_decode", v, name, shmem), (-(-hidden // rows), t),
               256, out, h, hs, w_down, shared_down, weights, ids, shared_w, k, hidden, inter,
               s_inter, int(t <= FUSED_MAX_TOKENS), shmem=shmem, pdl=self.ctx.pdl)
        return out

    def down_kernel(self, t: int, k: int, inter: int, hidden: int, v: str,
                    s_inter: int = 0) -> str:
        """The one-token down kernel policy ``moe_down`` picks: ``rows``
        (``moe_dec_down_rows``: h staged in shared memory, :data:`DOWN_ROWS` rows a warp; bf16 /
        f16, top-k <= 8, I and the shared expert's width multiples of 8, h within
        :data:`DOWN_ROWS_MAX_SHMEM`), ``wide`` (``moe_dec_down_w<chunks>``: I <= 1,024, every
        expert row's loads in flight at once) or ``moe_dec_down``. ``auto`` takes ``rows``
        where it applies (H200 batch 1, 1,024 tokens, against the session-22 auto, session 23:
        gemma-4-26b-a4b 3.68 -> 3.46 ms, minimax-m2 1.10 -> 1.03, qwen3-30b-a3b 2.65 -> 2.65),
        else the wide kernel only where its ``ceil(hidden / 8)`` blocks are resident at once: at
        121 registers (``_w3``) two blocks fit an SM, and gemma-4-26b-a4b's 352 blocks on 132
        SMs ran in 1.33 waves at 26.5 us, 21% of DRAM bandwidth (H200, ncu)."""
        chunks, mode = -(-inter // 256), self.ctx.policy.moe_down
        if mode in ("rows", "auto") and t == 1 and k <= 8 and v in ("bf16", "f16") \
                and not inter % 8 and not s_inter % 8 \
                and 4 * (k * inter + s_inter) <= DOWN_ROWS_MAX_SHMEM:
            return f"moe_dec_down_rows_{v}"
        if not (t == 1 and k <= 8 and chunks <= 4) or mode in ("plain", "rows"):
            return f"moe_dec_down_{v}"
        name = f"moe_dec_down_w{chunks}_{v}"
        if mode == "wide":
            return name
        per_sm = self._down_occupancy.get(name)
        if per_sm is None:
            kern = self.ctx.kernels.kernel("moe_decode", v, name)
            per_sm = self._down_occupancy[name] = \
                kern.occupancy.max_active_blocks_per_multiprocessor(256, 0)
        return name if -(-hidden // 8) <= per_sm * self.ctx.num_sms else f"moe_dec_down_{v}"
