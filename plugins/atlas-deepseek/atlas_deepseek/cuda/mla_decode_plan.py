"""Which tensor-core kernel runs absorbed MLA decode rows, with what tiles, pipeline depth and
shared memory: host arithmetic only (no GPU, no compile), so it is tested on a laptop.

Three kernels write the same partials for ``mla_decode_combine``:

- ``mla_decode_keys2.cu``: warp pairs split the keys of a tile, the two warps of a pair split
  the output columns; 128 registers, 16 warps an SM, as two 8-warp blocks
  (``mla_decode_keys2x2``, the default where it has the shape) or one 16-warp block
  (``mla_decode_keys2``);
- ``mla_decode_keys.cu``: warps split the keys, each holds every output column (8 warps an SM);
- ``mla_decode_mma.cu``: warps split the row width (the only one for DeepSeek-V3 / Kimi-K2).

``ATLAS_MLA_DECODE`` picks the first choice for A/B runs (``keys2x2``: the default, ``keys2``,
``keys1``, ``v1``); a shape or device the choice cannot take falls back down that list.
Measured on an H200 (session 19, ``scripts/mla_decode_bench.py --ab``, Mistral-Small-4 heads):
``keys2x2`` is the fastest at 1,024 tokens (batch 1/8/32) and at 32,768 tokens with 8 or 32
sequences (7-10% under ``keys1``); ``keys1`` keeps batch 1 at 32,768 tokens (20.1 against 22.4
us), one cell not worth a second default.
"""

from __future__ import annotations

from typing import NamedTuple


class DecodeConfig(NamedTuple):
    """One compiled layout of a decode kernel; must match its ``.cu`` instantiation."""

    module: str  #: the ``.cu`` file (without suffix)
    kernel: str  #: name prefix: the kernel is ``<kernel>_r<rank>_<dtype>``
    heads: int  #: heads per block (16 per m16 tile)
    warps: int  #: warps per block
    keys: int  #: keys per pipeline tile
    blocks_per_sm: int  #: resident blocks the shared-memory budget leaves room for


class DecodePlan(NamedTuple):
    """A config with the pipeline depth and dynamic shared memory chosen for one device."""

    config: DecodeConfig
    stages: int
    shmem: int


#: Per (kv_lora_rank, rope dim): ``MLA_KEYS2`` in mla_decode_keys2.cu.
KEYS2_DECODE_CONFIGS = {
    (256, 64): (DecodeConfig("mla_decode_keys2", "mla_decode_keys2", 32, 16, 64, 1),
                DecodeConfig("mla_decode_keys2", "mla_decode_keys2x2", 32, 8, 32, 2)),
}
#: ``MLA_KEYS`` in mla_decode_keys.cu.
KEYS_DECODE_CONFIGS = {(256, 64): DecodeConfig("mla_decode_keys", "mla_decode_keys", 32, 8, 64, 1)}
#: ``MLA_MMA`` in mla_decode_mma.cu.
MMA_DECODE_CONFIGS = {
    (512, 64): DecodeConfig("mla_decode_mma", "mla_decode_mma", 64, 8, 32, 1),
    (256, 64): DecodeConfig("mla_decode_mma", "mla_decode_mma", 32, 8, 64, 1),
}
#: cp.async pipeline depths, deepest first (as many as the shared-memory budget holds).
MMA_STAGES = (4, 3, 2)
#: Most context splits per resident block an SM holds (batch 1 of Mistral-Small-4 fills an
#: H100 / H200 with ~128 splits a block-slot); never past the combine's 256.
MMA_MAX_SPLITS = 128
#: ``ATLAS_MLA_DECODE`` values, each with the kernels it tries in order.
CHOICES = {"keys2": ("keys2", "keys1", "v1"), "keys2x2": ("keys2x2", "keys1", "v1"),
           "keys1": ("keys1", "v1"), "v1": ("v1",)}
#: Shared memory the driver reserves per resident block (bytes, sm_80+): an SM holds
#: ``optin + RESERVED`` in all, ``blocks * (bytes + RESERVED)`` of it for ``blocks`` blocks.
RESERVED = 1024


def _candidates(rank: int, rope: int, choice: str) -> list[DecodeConfig]:
    found = []
    for name in CHOICES.get(choice or "keys2x2", CHOICES["keys2x2"]):
        if name.startswith("keys2"):
            configs = KEYS2_DECODE_CONFIGS.get((rank, rope), ())
            found += [c for c in configs if c.kernel == f"mla_decode_{name}"]
        elif name == "keys1" and (rank, rope) in KEYS_DECODE_CONFIGS:
            found.append(KEYS_DECODE_CONFIGS[(rank, rope)])
        elif name == "v1" and (rank, rope) in MMA_DECODE_CONFIGS:
            found.append(MMA_DECODE_CONFIGS[(rank, rope)])
    return found


def _shared_bytes(config: DecodeConfig, rank: int, rope: int, stages: int) -> tuple[int, int]:
    """(dynamic, static) shared bytes of ``config`` at ``stages``: the query rows and the ring
    (padded bf16 / f16 rows), plus what each kernel keeps beside them."""
    row = (rank + rope + 8) * 2
    ht, bn = config.heads, config.keys
    ring = (ht + stages * bn) * row
    if config.module == "mla_decode_mma":  # per-warp score partials beside the ring
        nw = config.warps // (ht // 16)
        return ring + nw * ht * (bn + 8) * 4, 0
    kw = bn // 16  # key slices: the merge buffer [kw][ht][rank + 8] floats reuses the ring
    merge, static = kw * ht * (rank + 8) * 4, 3 * kw * ht * 4
    if config.module == "mla_decode_keys2":  # + the pairs' score exchange, [pairs][2][8][32]
        ring += (config.warps // 2) * 2 * 8 * 32 * 4
    return max(ring, merge), static


def decode_plan(rank: int, rope: int, smem_optin: int, choice: str = "") -> DecodePlan | None:
    """The first kernel of ``choice``'s list (``ATLAS_MLA_DECODE``) that has this latent shape
    and whose ``blocks_per_sm`` blocks of two or more stages fit an SM with ``smem_optin`` bytes
    of opt-in shared memory per block (the deepest such ring), or None (the SIMT kernel runs)."""
    for config in _candidates(rank, rope, choice):
        for stages in MMA_STAGES:
            shmem, static = _shared_bytes(config, rank, rope, stages)
            per_block = shmem + static + RESERVED
            if config.blocks_per_sm * per_block <= smem_optin + RESERVED:
                return DecodePlan(config, stages, shmem)
    return None


def decode_splits(plan: DecodePlan, batch: int, groups: int, num_sms: int,
                  max_ctx: int) -> int:
    """Context splits: one wave of blocks (``blocks_per_sm * num_sms // (batch * groups)``; a
    partial second wave would double the time), at most ``MMA_MAX_SPLITS`` per block-slot and
    256 (``mla_decode_combine``), no more than one per two key tiles of ``max_ctx``."""
    config = plan.config
    cap = min(256, MMA_MAX_SPLITS * config.blocks_per_sm)
    wave = config.blocks_per_sm * num_sms // (batch * groups)
    return max(1, min(cap, wave, -(-max_ctx // (2 * config.keys))))
