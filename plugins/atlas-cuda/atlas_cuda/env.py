"""The ``ATLAS_CUDA_*`` environment variables of the cuda backend (listed in docs/env_vars.md)."""

from __future__ import annotations

import os

GEMM_MODES = ("auto", "cublaslt", "mma")
ATTENTION_MODES = ("auto", "flash", "simt")
MOE_MODES = ("auto", "grouped", "gemv")
MOE_DECODE_KERNELS = ("block", "warp")
MOE_FUSED_MODES = ("auto", "1", "0")
MOE_PLAIN_MODES = ("logits", "route")
MOE_ROUTER_MODES = ("gemv", "block")
MOE_EXPERTS1_MODES = ("auto", "1", "0")
MOE_EXPERTS1_OVERLAP = ("1", "0")
GEMV_CHUNKS = ("4", "8")
GDN_PREFILL_MODES = ("auto", "chunked", "sequential")
GDN_DECODE_KERNELS = ("auto", "split", "head")


def _choice(name: str, allowed: tuple[str, ...]) -> str:
    value = os.environ.get(name, allowed[0]).strip().lower() or allowed[0]
    if value not in allowed:
        raise ValueError(f"{name}={value!r} is not valid; use one of {', '.join(allowed)}")
    return value


def gemm_mode() -> str:
    """``ATLAS_CUDA_GEMM``: matmuls with more than 8 rows: ``auto`` (cuBLASLt when
    nvmath-python is installed, else the own mma.sync kernel), ``cublaslt`` (required) or ``mma``."""
    return _choice("ATLAS_CUDA_GEMM", GEMM_MODES)


def attention_mode() -> str:
    """``ATLAS_CUDA_ATTENTION``: multi-token (prefill) attention: ``auto``/``flash`` (tensor-core
    flash kernel for bf16/f16 with head_dim 64/128) or ``simt`` (the CUDA-core kernel only)."""
    return _choice("ATLAS_CUDA_ATTENTION", ATTENTION_MODES)


def pdl_enabled() -> bool:
    """``ATLAS_CUDA_PDL``: ``1`` (default) launches the GEMV kernels with programmatic dependent
    launch on sm_90+ (their weight fetch overlaps the previous kernel's tail); ``0`` turns it off."""
    return os.environ.get("ATLAS_CUDA_PDL", "1").strip() not in ("0", "false", "no", "off")


def attn_decode_old() -> bool:
    """``ATLAS_CUDA_ATTN_DECODE=old``: the previous decode attention (split kernel + separate
    combine), one-block-per-token rope and one-block-per-row sampling, kept for A/B timing."""
    return os.environ.get("ATLAS_CUDA_ATTN_DECODE", "").strip().lower() == "old"


def rope_attention_fused() -> bool:
    """``ATLAS_CUDA_ROPE_ATTENTION``: unset fuses ``rope_cache_attention`` into one decode kernel
    where it applies; ``split`` always runs the rope prologue then attention (A/B timing)."""
    return os.environ.get("ATLAS_CUDA_ROPE_ATTENTION", "").strip().lower() != "split"


def pdl_chain() -> bool:
    """``ATLAS_CUDA_PDL_CHAIN``: ``1`` (default, with ``ATLAS_CUDA_PDL``) also launches the rope
    prologue and decode attention with programmatic dependent launch, so their blocks (and the
    o_proj GEMV after them, with its L2 prefetch) are resident before the previous kernel ends;
    ``0``: only the GEMVs and fused decode ops use it."""
    return _flag("ATLAS_CUDA_PDL_CHAIN", "1")


def moe_down_wide() -> bool:
    """``ATLAS_CUDA_MOE_DOWN_WIDE``: ``1`` (default) runs the decode MoE down kernel for one token
    with all of a warp's chosen-expert row loads in flight at once (top-k <= 8, expert width
    <= 1,024: ``moe_dec_down_w<chunks>``, ``mb_down[_t]_w<chunks>``; H200 qwen3.5-35b-a3b batch 1 309.6 -> 316.0
    tok/s); ``0``: the loop over 256-column chunks. Not used for 2+ tokens, where it measured
    slower (30B block at 8 tokens 167 -> 200 us in the per-pair path)."""
    return _flag("ATLAS_CUDA_MOE_DOWN_WIDE", "1")


def moe_mode() -> str:
    """``ATLAS_CUDA_MOE``: ``moe_experts`` path: ``auto`` (grouped tensor-core GEMM once the
    (token, expert) pairs reach twice the experts, else per-pair GEMV), ``grouped`` or ``gemv``."""
    return _choice("ATLAS_CUDA_MOE", MOE_MODES)


def moe_fused() -> str:
    """``ATLAS_CUDA_MOE_FUSED``: ``moe_block`` for at most 8 tokens as three kernels:
    ``auto`` (default: blocks with a shared expert, where it measured faster on an H200; a plain
    MoE block (Qwen3-30B-A3B) made the whole step slower, with both kernel sets), ``1`` (always)
    or ``0`` (never: router ``linear``, ``moe_route``, ``moe_experts`` and the shared expert's ops
    one by one)."""
    return _choice("ATLAS_CUDA_MOE_FUSED", MOE_FUSED_MODES)


def moe_router() -> str:
    """``ATLAS_CUDA_MOE_ROUTER``: the router of a one-token MoE block with a shared expert
    (Qwen3.5 / Qwen3-Next): ``gemv`` (default) the fused norm + router GEMV of plain MoE blocks
    over the router and shared-gate rows stacked once into one matrix, logits in the activation
    dtype (as HF computes them); ``block``: ``moe_block.cu``'s ``mb_router`` (float logits)."""
    return _choice("ATLAS_CUDA_MOE_ROUTER", MOE_ROUTER_MODES)


def moe_plain() -> str:
    """``ATLAS_CUDA_MOE_PLAIN``: a plain MoE block (no shared expert, e.g. Qwen3-30B-A3B) of at
    most 8 tokens after the fused norm + router GEMV: ``logits`` (default) runs ``moe_block.cu``'s
    two expert kernels on the router logits (each block picks the top-k itself: no routing
    kernel); ``route`` runs ``moe_route`` then ``moe_experts``."""
    return _choice("ATLAS_CUDA_MOE_PLAIN", MOE_PLAIN_MODES)


def moe_experts1() -> str:
    """``ATLAS_CUDA_MOE_EXPERTS1``: one token's experts after the router as a single persistent
    kernel (``moe_experts1.cu``: gate_up, a grid-wide barrier, down; the down weights stream
    right behind the gate_up weights): ``auto`` (default) and ``1`` wherever it applies (one
    token, bf16/f16, at most 256 experts, top-k <= 8, widths <= 1,024; H200 batch 1 with its
    selection overlapped: qwen3-30b-a3b 405 tok/s against 367.7 for ``moe_block.cu``'s two
    kernels, qwen3.5-35b-a3b 382.9 against 371.8), ``0`` never."""
    return _choice("ATLAS_CUDA_MOE_EXPERTS1", MOE_EXPERTS1_MODES)


def moe_experts1_overlap() -> bool:
    """``ATLAS_CUDA_MOE_EXPERTS1_OVERLAP``: ``1`` (default): in ``moe_experts1`` warp 0 publishes
    each routing slot's expert as soon as it is picked and the block's gate_up rows (shared
    expert first) are handed to its warps one at a time, so the others start loading while the
    selection runs; ``0``: the whole block waits for the top-k and each warp has fixed rows."""
    return _choice("ATLAS_CUDA_MOE_EXPERTS1_OVERLAP", MOE_EXPERTS1_OVERLAP) == "1"


def batch_uploads() -> bool:
    """``ATLAS_CUDA_BATCH_UPLOADS``: ``1`` (default) sends a step's inputs (``copy_many``) as one
    host-to-device transfer and one scatter kernel; ``0`` copies each array on its own (about 15
    transfers a decode step, each a few microseconds of device time between graph replays)."""
    return _flag("ATLAS_CUDA_BATCH_UPLOADS", "1")


def moe_decode_kernel() -> str:
    """``ATLAS_CUDA_MOE_DECODE``: kernels of the fused ``moe_block``: ``block`` (default,
    ``moe_block.cu``: router logits in many blocks, every expert warp picks its token's top-k
    itself; one token, at most 256 experts and top-k 8, else ``warp``; H200 qwen3.5-35b-a3b batch 1
    320.8 -> 352.8 tok/s) or ``warp`` (``moe_decode.cu``'s router with a last-block top-k, then
    expert kernels with a warp per output row). A ``split`` variant (a block per 8 rows) measured
    slower and was removed (code in 75fc2d3)."""
    return _choice("ATLAS_CUDA_MOE_DECODE", MOE_DECODE_KERNELS)


def moe_norm_fold() -> bool:
    """``ATLAS_CUDA_MOE_NORM_FOLD``: ``1`` (default) folds ``rms_norm_moe_block``'s norm and
    residual add into the ``block`` router kernel; ``0`` runs ``rms_norm`` then ``moe_block``."""
    return _flag("ATLAS_CUDA_MOE_NORM_FOLD", "1")


def gdn_fused() -> bool:
    """``ATLAS_CUDA_GDN_FUSED``: ``1`` (default; measured faster on an H200) runs
    ``gated_delta_rule_decode`` as two kernels (conv update + gating; recurrent step + gated norm);
    ``0`` runs ``causal_conv1d_update``, ``gdn_gating``, ``gated_delta_rule_recurrent``,
    ``rms_norm_gated``."""
    return _flag("ATLAS_CUDA_GDN_FUSED", "1")


def gdn_prefill() -> str:
    """``ATLAS_CUDA_GDN_PREFILL``: ``gated_delta_rule_chunked`` kernels: ``auto`` (default: the
    chunked WY kernels of ``gdn_chunked.cu`` once a step has ``GDN_CHUNKED_MIN_TOKENS`` tokens,
    else the token-sequential kernel), ``chunked`` or ``sequential`` (``delta_rule.cu``)."""
    return _choice("ATLAS_CUDA_GDN_PREFILL", GDN_PREFILL_MODES)


def gdn_decode_kernel() -> str:
    """``ATLAS_CUDA_GDN_DECODE``: recurrent step + gated norm kernel of the fused
    ``gated_delta_rule_decode``: ``auto`` (default: ``split`` for steps of at most
    ``ops_gdn.SPLIT_MAX_SEQS`` sequences, else ``head``), ``split`` (sm_90+: each value head's
    columns over a thread block cluster, ``gdn_decode_split``) or ``head`` (a block per value
    head, ``gdn_decode_norm``)."""
    return _choice("ATLAS_CUDA_GDN_DECODE", GDN_DECODE_KERNELS)


def gemv_preload() -> str:
    """``ATLAS_CUDA_GEMV_PRELOAD``: weight groups a decode GEMV without the norm prologue loads
    before its PDL wait: ``auto`` (default: two right after decode attention or a GDN recurrent
    step, else one), ``one`` or ``two`` (always)."""
    return _choice("ATLAS_CUDA_GEMV_PRELOAD", ("auto", "one", "two"))


def _flag(name: str, default: str) -> bool:
    return os.environ.get(name, default).strip().lower() not in ("0", "false", "no", "off")


def fuse_gate_up() -> bool:
    """``ATLAS_CUDA_FUSE_GATE_UP``: ``1`` runs ``linear_act_and_mul`` with at most 8 rows as one
    GEMV that writes ``act(gate) * up`` (``gemv_fused.cu``); ``0`` (default: the fused kernel
    gained nothing on the qwen3-8b shape on an H200) runs ``linear`` then the gated activation."""
    return _flag("ATLAS_CUDA_FUSE_GATE_UP", "0")


def gemv_chunks() -> int:
    """``ATLAS_CUDA_GEMV_CHUNKS``: 16-byte weight loads each lane keeps in flight in ``linear``
    with at most 8 rows: ``4`` (default, ``linear.cu``) or ``8`` (``gemv_fused.cu``; 3-9% slower
    on the qwen3-8b GEMVs on an H200)."""
    return int(_choice("ATLAS_CUDA_GEMV_CHUNKS", GEMV_CHUNKS))


def norm_gemv() -> bool:
    """``ATLAS_CUDA_NORM_GEMV``: ``1`` (default) runs ``rms_norm_linear`` with at most 8 rows as
    one GEMV whose blocks each normalise the rows in a prologue (``gemv_norm.cu``); ``0`` runs
    ``rms_norm`` then ``linear`` / ``linear_act_and_mul`` (the kernels of before)."""
    return _flag("ATLAS_CUDA_NORM_GEMV", "1")


def gemv_prefetch_mb() -> float:
    """``ATLAS_CUDA_GEMV_PREFETCH_MB``: GEMVs with at most 8 rows whose weight is at most this many
    MiB (and at most 3/4 of the L2 cache) ask L2 for the whole matrix before their PDL wait, so
    it streams while the short kernels before them run. Default ``0`` (off): on an H200 it cost
    1-3% of batch-1 decode (qwen3-8b 209.9 -> 207.7 tok/s, 30B 291.8 -> 283.2, 35B 309.7 ->
    306.0 with 40 MiB), so it is kept only as an experiment."""
    value = os.environ.get("ATLAS_CUDA_GEMV_PREFETCH_MB", "0").strip() or "0"
    try:
        return max(0.0, float(value))
    except ValueError:
        raise ValueError(f"ATLAS_CUDA_GEMV_PREFETCH_MB={value!r} is not a number of MiB "
                         "(e.g. 40, or 0 to turn the L2 prefetch off)") from None


def gemv_tile() -> str:
    """``ATLAS_CUDA_GEMV_TILE``: the ``gemv_norm.cu`` GEMV of ``linear`` with at most 8 rows:
    ``auto`` (default: columns per warp and K splits per shape), ``old`` (``linear.cu`` /
    ``ATLAS_CUDA_GEMV_CHUNKS``) or ``g<G>s<S>`` (G columns per warp, 1/2/4; S warps splitting
    K, 1/2/4/8), e.g. ``g2s1``; the fused norm GEMVs take the same (G at most 2 with an
    activation, where each column reads a gate and an up row)."""
    value = os.environ.get("ATLAS_CUDA_GEMV_TILE", "auto").strip().lower() or "auto"
    ok = value in ("auto", "old") or (len(value) == 4 and value[0] == "g" and value[2] == "s"
                                       and value[1] in "124" and value[3] in "1248")
    if not ok:
        raise ValueError(f"ATLAS_CUDA_GEMV_TILE={value!r} is not valid; use auto, old or "
                         "g<1|2|4>s<1|2|4|8> (e.g. g2s1)")
    return value
