"""KernelPolicy: the cuda backend's kernel choices, resolved once per backend and frozen.

Three layers, later ones winning: the hardware target's defaults (``[policy]`` of
``kernels/<hw>/common/HARDWARE.toml``), the model's (``[policy]`` of the target's
``<model>/[<quant>/]MODEL.toml``), then the ``ATLAS_CUDA_*`` environment variables, parsed here
and nowhere else (docs/env_vars.md lists them). Op modules read ``ctx.policy.<field>``; nothing
reads the environment at call time.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


@dataclass(frozen=True)
class Knob:
    """One policy field: its environment variable, allowed values (None: a boolean) and meaning."""

    name: str
    env: str
    choices: tuple[str, ...] | None
    help: str


KNOBS = (
    Knob("gemm", "ATLAS_CUDA_GEMM", ("auto", "cublaslt", "mma", "skinny"),
         "matmuls of more than one row: auto (cuBLASLt when nvmath-python is installed, else the "
         "own mma.sync kernel), cublaslt (required), mma, or skinny (2-32 rows of a bf16 / f16 "
         "linear on the quantized skinny kernel's dense variant, qskinny_dense; more rows as "
         "auto; opt-in, not yet measured)"),
    Knob("gemm_tune", "ATLAS_CUDA_GEMM_TUNE", None,
         "cuBLASLt matmuls of at most 256 rows: time the heuristic's first 8 algorithms of each "
         "decode graph shape on its operands (L2 flushed between runs) and keep the fastest, "
         "instead of taking its first (atlas_cuda.gemm_tune; a few ms a shape at start-up, "
         "never in a served step); opt-in: on an H200 it lost qwen3-8b batch 4 at 1k tokens "
         "(5.18 -> 5.26 ms) while winning batches 2, 8 and 32"),
    Knob("attention", "ATLAS_CUDA_ATTENTION", ("auto", "flash", "simt"),
         "multi-token attention: auto/flash (tensor-core flash kernel where it applies) or simt"),
    Knob("decode_plan", "ATLAS_CUDA_DECODE_PLAN", ("auto", "shared", "split", "mma"),
         "split decode attention: mma (tensor-core kernel: a GQA group's query heads as the "
         "rows of one mma tile, bf16/f16 caches), shared (CUDA cores, every query head of a KV "
         "head in one block, so K/V are read once, and more splits), split (CUDA cores, fewer "
         "heads a block where that fills the GPU) or auto (mma where it applies and the cache "
         "may hold more than 512 tokens a sequence, 16,384 for one query token in "
         "rope_cache_attention (4,096 for groups of 3 / 5 / 6 / 7); else shared "
         "above 4,096 tokens, split below)"),
    Knob("decode_merge", "ATLAS_CUDA_DECODE_MERGE", ("auto", "block", "kernel"),
         "split partials of the tensor-core decode attention: auto/block (the last split block "
         "of a GQA group merges them alone; the plan caps them, at head dim 512 taking 2-8 heads "
         "a block) or kernel (attn_dec_merge_*, a kernel of its own, a block a (token, head): "
         "the whole GQA group a split block, a wave of splits; opt-in: written in session 25 "
         "without a GPU)"),
    Knob("pdl", "ATLAS_CUDA_PDL", None,
         "programmatic dependent launch of the decode kernels on sm_90+"),
    Knob("moe", "ATLAS_CUDA_MOE", ("auto", "grouped", "gemv"),
         "moe_experts: auto (grouped GEMM from two (token, expert) pairs per expert, else "
         "per-pair GEMV), grouped or gemv"),
    Knob("moe_fused", "ATLAS_CUDA_MOE_FUSED", ("auto", "1", "0"),
         "moe_block of at most 8 tokens as fused decode kernels: auto (blocks with a shared "
         "expert), 1 (always) or 0 (never)"),
    Knob("moe_down", "ATLAS_CUDA_MOE_DOWN", ("auto", "wide", "plain", "rows"),
         "moe_decode.cu's down kernel for one token: wide (every chosen expert row's loads in "
         "flight at once; 62-173 registers a thread), plain (a loop over 256-column chunks, 38 "
         "registers), rows (the token's h staged in shared memory, two rows a warp) or auto (rows "
         "where it applies: bf16 / f16, top-k <= 8, h within 96 KiB; else wide where its "
         "blocks fit the GPU in one wave, else plain)"),
    Knob("rope", "ATLAS_CUDA_ROPE", ("auto", "generic", "vec"),
         "the separate q/k-norm + rotary + KV-write kernel: generic (rope_cache.cu, a head 32 "
         "elements at a time through shared memory), vec (rope_vec.cu at head dims 256 / 512: "
         "a head in registers, cos / sin and norm weights loaded before the PDL wait, where it "
         "applies, else generic) or auto (the same as vec since session 23)"),
    Knob("gemv_tile", "ATLAS_CUDA_GEMV_TILE", None,
         "decode GEMV tile: auto (per shape) or g<1|2|4>s<1|2|4|8> (columns per warp, K splits)"),
    Knob("gemv_rows", "ATLAS_CUDA_GEMV_ROWS", None,
         "rows up to which a linear takes the decode GEMV kernels (dense and quantized): auto "
         "(measured per target) or 1-8; more rows take the tensor-core path (cuBLASLt / mma, "
         "the quantized skinny GEMM)"),
    Knob("quant_kernel", "ATLAS_CUDA_QUANT_KERNEL", ("auto", "skinny", "legacy"),
         "quantized linears of 1-64 rows and decode MoE experts: auto/skinny (tensor-core "
         "skinny GEMM and quant_moe_mma.cu, weights decoded with integer ops) or legacy (f32 "
         "GEMV up to gemv_rows rows, then the older skinny GEMM; quant_moe.cu's "
         "warp-per-column experts)"),
    Knob("gdn_fused", "ATLAS_CUDA_GDN_FUSED", None,
         "gated_delta_rule_decode as two fused kernels (0: the four separate ops)"),
    Knob("gdn_prefill", "ATLAS_CUDA_GDN_PREFILL", ("auto", "chunked", "sequential"),
         "gated_delta_rule_chunked kernels: auto, chunked or sequential"),
    Knob("gdn_decode", "ATLAS_CUDA_GDN_DECODE", ("auto", "split", "head"),
         "recurrent step kernel of the fused GDN decode: auto, split or head"),
    Knob("quant_weights", "ATLAS_CUDA_QUANT_WEIGHTS", None,
         "keep FP8 / NVFP4 checkpoint weights quantized on the device (W8A16 / W4A16 kernels, "
         "atlas_cuda.ops_quant); off until they are faster than bf16 (correct on an H200): such "
         "checkpoints are dequantized to the activation dtype at load"),
    Knob("batch_invariant", "ATLAS_CUDA_BATCH_INVARIANT", None,
         "batch-invariant mode (atlas serve --batch-invariant): every op takes one kernel whose "
         "per-row summation order depends on neither the step's rows nor a row's place in it; "
         "overrides the fields of BATCH_INVARIANT_FIELDS (docs/serving.md, Determinism)"),
)
KNOB_BY_NAME = {k.name: k for k in KNOBS}


@dataclass(frozen=True)
class KernelPolicy:
    """The kernel choices of one cuda backend (see :data:`KNOBS` for each field's meaning).

    Attributes:
        gemv_tile: ``None`` for ``auto``, else the forced ``(columns per warp, K splits)``.
        gemv_rows: ``None`` for ``auto``, else the most rows a linear serves with a GEMV.
        origins: ``(field, where its value came from)`` for every field not at its default.
    """

    gemm: str = "auto"
    gemm_tune: bool = False
    attention: str = "auto"
    decode_plan: str = "auto"
    decode_merge: str = "auto"
    pdl: bool = True
    moe: str = "auto"
    moe_fused: str = "auto"
    moe_down: str = "auto"
    rope: str = "auto"
    gemv_tile: tuple[int, int] | None = None
    gemv_rows: int | None = None
    quant_kernel: str = "auto"
    gdn_fused: bool = True
    gdn_prefill: str = "auto"
    gdn_decode: str = "auto"
    quant_weights: bool = False
    batch_invariant: bool = False
    origins: tuple[tuple[str, str], ...] = field(default=(), compare=False)

    def describe(self) -> list[tuple[str, str, str, str]]:
        """``(field, env variable, value, origin)`` rows for logs and ``atlas doctor``."""
        origin = dict(self.origins)
        return [(k.name, k.env, format_value(k.name, getattr(self, k.name)),
                 origin.get(k.name, "default")) for k in KNOBS]

    def summary(self) -> str:
        """One log line: every field and, where not the default, its origin."""
        return ", ".join(f"{name}={value}" + ("" if where == "default" else f" ({where})")
                         for name, _, value, where in self.describe())


#: What ``batch_invariant`` forces, and why each choice (the kernels read for it are named in
#: docs/serving.md, Determinism). ``gemv_rows`` has no "never" value: :func:`~atlas_cuda.ops_gemv.
#: gemv_rows` returns 0 in this mode, so no linear (and no fused norm GEMV) takes a GEMV.
BATCH_INVARIANT_FIELDS = (
    # linear.cu's mma GEMM: each output is accumulated over K in 16-wide mma steps from k = 0
    # upwards whatever the tile (the tile only picks which outputs a block owns, no split-K);
    # cuBLASLt picks algorithms (split-K among them) by M.
    ("gemm", "mma"),
    # the split-K kernel for every row, prefill rows included: flash (multi-token steps) and the
    # split-K kernel (decode) round differently, and which one a row took depended on the step
    # (query tokens >= 4x sequences); its split count is pinned by AttentionOps._decode_plan.
    ("attention", "simt"),
    # the grouped GEMM for every step (per (token, expert) pair, K from 0 upwards, then a per
    # token combine over top_k in order); the per-pair GEMV and fused small-batch kernels were
    # chosen by the pair count.
    ("moe", "grouped"),
    ("moe_fused", "0"),
    # GDN: the token-sequential recurrence for prefill chunks and decode rows alike (f32 state
    # between tokens, so chunk boundaries change no bit); the chunked WY form rounds by chunk.
    ("gdn_fused", False),
    ("gdn_prefill", "sequential"),
    # quantized weights take GEMV / skinny / GEMM kernels by row count: dequantize at load.
    ("quant_weights", False),
)


def with_batch_invariance(policy: KernelPolicy, where: str = "batch_invariant") -> KernelPolicy:
    """``policy`` with ``batch_invariant`` on and :data:`BATCH_INVARIANT_FIELDS` forced
    (``where`` names the source in :attr:`KernelPolicy.origins`). Idempotent."""
    forced = dict(BATCH_INVARIANT_FIELDS, batch_invariant=True)
    origins = dict(policy.origins)
    for name, value in forced.items():
        if getattr(policy, name) != value or name not in origins:
            origins[name] = where
    return replace(policy, **forced, origins=tuple(sorted(origins.items())))


def format_value(name: str, value: Any) -> str:
    """A field's value as its environment variable would spell it."""
    if name == "gemv_tile":
        return "auto" if value is None else f"g{value[0]}s{value[1]}"
    if name == "gemv_rows":
        return "auto" if value is None else str(value)
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def parse_value(name: str, raw: Any, where: str) -> Any:
    """Parse ``raw`` for field ``name``; ``where`` names the source in the error message.

    Raises:
        ValueError: unknown field or a value it does not allow, naming ``where`` and the values
            it takes.
    """
    knob = KNOB_BY_NAME.get(name)
    if knob is None:
        raise ValueError(f"{where}: unknown kernel policy field {name!r}; known: "
                         f"{', '.join(KNOB_BY_NAME)}")
    text = (str(int(raw)) if isinstance(raw, bool) else str(raw)).strip().lower()
    if knob.choices is not None:
        if text not in knob.choices:
            raise ValueError(f"{where}={raw!r} is not valid; use one of {', '.join(knob.choices)}")
        return text
    if name == "gemv_tile":
        if text == "auto":
            return None
        if len(text) == 4 and text[0] == "g" and text[2] == "s" and text[1] in "124" \
                and text[3] in "1248":
            return int(text[1]), int(text[3])
        raise ValueError(f"{where}={raw!r} is not valid; use auto or g<1|2|4>s<1|2|4|8> "
                         "(e.g. g2s1)")
    if name == "gemv_rows":
        if text == "auto":
            return None
        if text.isdigit() and 1 <= int(text) <= 8:
            return int(text)
        raise ValueError(f"{where}={raw!r} is not valid; use auto or a row count from 1 to 8")
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"{where}={raw!r} is not valid; use 1 or 0")


def resolve(hardware: Mapping[str, Any] | None = None, model: Mapping[str, Any] | None = None,
            environ: Mapping[str, str] | None = None, *, hardware_name: str = "hardware target",
            model_name: str = "model") -> KernelPolicy:
    """The policy from target defaults, then the model's, then ``ATLAS_CUDA_*`` variables.

    Args:
        hardware: ``[policy]`` table of the target's HARDWARE.toml.
        model: ``[policy]`` table of the model's MODEL.toml (or any model-level mapping).
        environ: the environment (default ``os.environ``); empty values count as unset.
        hardware_name, model_name: how errors and :attr:`KernelPolicy.origins` name the two
            files.

    Raises:
        ValueError: an unknown field or invalid value, naming the file or variable.
    """
    values: dict[str, Any] = {}
    origins: dict[str, str] = {}
    for source, where in ((hardware, hardware_name), (model, model_name)):
        for name, raw in (source or {}).items():
            values[name] = parse_value(name, raw, f"{where} [policy] {name}")
            origins[name] = where
    env = os.environ if environ is None else environ
    for knob in KNOBS:
        raw = env.get(knob.env, "")
        if raw.strip():
            values[knob.name] = parse_value(knob.name, raw, knob.env)
            origins[knob.name] = knob.env
    policy = KernelPolicy(**values, origins=tuple(sorted(origins.items())))
    if policy.batch_invariant:
        policy = with_batch_invariance(policy, origins["batch_invariant"])
    return policy


def policy_table(path: Path) -> dict[str, Any]:
    """The ``[policy]`` table of a TOML file, or ``{}`` when the file or table is absent."""
    if not path.is_file():
        return {}
    table = tomllib.loads(path.read_text()).get("policy", {})
    if not isinstance(table, dict):
        raise ValueError(f"{path}: [policy] must be a table of field = value")
    return table


def target_policy(target: Any, model: str | None = None, quant: str | None = None,
                  environ: Mapping[str, str] | None = None) -> KernelPolicy:
    """The policy of ``target`` (:class:`~atlas_cuda.targets.Target`) for a model family and
    quantisation: its HARDWARE.toml ``[policy]``, then the most specific MODEL.toml found under
    ``<model>/<quant>/`` or ``<model>/``, then the environment."""
    model_table, model_name = {}, "model"
    if target.root is not None and model:
        for folder in ([target.root / model / quant] if quant else []) + [target.root / model]:
            table = policy_table(folder / "MODEL.toml")
            if table:
                model_table, model_name = table, str(folder / "MODEL.toml")
                break
    return resolve(target.hardware.get("policy"), model_table, environ,
                   hardware_name=f"{target.name} HARDWARE.toml", model_name=model_name)

