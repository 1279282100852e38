"""NVFP4 KV caches on the cuda backend (``--kv-cache-dtype nvfp4``; a ``uint8`` pool is packed
rows, :mod:`atlas_core.ops.kv_quant`): the cache write and the dequantizing gather of
``kv_nvfp4.cu``. :mod:`atlas_cuda.ops_attention` routes to them:

- cache writes (``reshape_and_cache``; ``qk_norm_rope_and_cache`` as rope into dense rows, then
  this write: the bytes are the reference's, which quantizes the rotated keys in the activation
  dtype too);
- decode and short chunks: the CUDA-core split decode kernel reads the packed rows directly
  (``attn_dec_nvfp4_*``); the tensor-core decode kernel and the fused rope + decode kernel do
  not take them;
- prefill chunks over a cached history (the flash kernel's shapes): the sequences' blocks are
  dequantized into a dense scratch of the step workspace, then the flash kernel runs on it,
  when that scratch is at most :data:`GATHER_MAX_BYTES`; else the split decode kernel.
"""

from __future__ import annotations

import numpy as np

from atlas_core.api import NVFP4_PREFILL_SCRATCH
from atlas_cuda.array import DeviceArray

#: Most bytes of the dense K + V scratch a prefill step over an nvfp4 history may take
#: (``num_seqs * max_blocks * block_size * kv_heads * head_dim * 2 * itemsize``; the step
#: workspace grows to hold it; the KV sizing keeps that much out of the pool,
#: :data:`atlas_core.engine.kv_layers.NVFP4_PREFILL_SCRATCH`). A 32k-token qwen3-8b sequence
#: needs 128 MiB: with 256 MiB, four such prompts prefilled together took the split decode
#: kernel (H200, batch 4 at 32k: TTFT 148 s against 12.3 s with a bf16 cache). Larger steps
#: still take it (correct, slow on long prompts).
GATHER_MAX_BYTES = NVFP4_PREFILL_SCRATCH
NVFP4 = np.dtype(np.uint8)


def is_nvfp4(cache: DeviceArray | None) -> bool:
    """A ``uint8`` cache is nvfp4-packed."""
    return cache is not None and cache.dtype == NVFP4


def check_row(name: str, cache: DeviceArray, head_dim: int) -> None:
    """Raise unless ``cache`` holds nvfp4 rows of ``head_dim`` (a multiple of 32)."""
    want = head_dim // 2 + head_dim // 16
    if head_dim % 32 or cache.shape[-1] != want:
        raise ValueError(f"{name}: an nvfp4 KV cache of head_dim {head_dim} needs rows of "
                         f"{want} bytes and head_dim a multiple of 32; got rows of "
                         f"{cache.shape[-1]}")


def write(ctx, k: DeviceArray, v: DeviceArray, k_cache: DeviceArray, v_cache: DeviceArray,
          slot_mapping: DeviceArray, kv_scale: float) -> None:
    """Quantize ``k``, ``v`` (``[t, kv_heads, head_dim]`` contiguous) into their slots."""
    t = k.shape[0]
    if not t:
        return
    kh = k_cache.shape[2]
    d = int(np.prod(k.shape[1:])) // kh
    check_row("reshape_and_cache", k_cache, d)
    ctx.launch(ctx.kernel("kv_nvfp4", k.dtype, "kv_nvfp4_write"), t, 128, k_cache, v_cache, k,
               v, slot_mapping, kh, d, float(1.0 / kv_scale))


def gather_bytes(num_seqs: int, max_blocks: int, block_size: int, kv_heads: int, head_dim: int,
                 dtype) -> int:
    """Bytes of the dense K + V scratch :func:`gather` takes (its block table besides)."""
    return 2 * num_seqs * max_blocks * block_size * kv_heads * head_dim * np.dtype(dtype).itemsize


#: First size of the gather scratch; a larger need allocates :data:`GATHER_MAX_BYTES` once.
GATHER_FIRST_BYTES = 64 << 20


class GatherScratch:
    """The dense K + V copy :func:`gather` writes, one buffer for every layer of every step.
    Taken from the step workspace, each layer's copy stayed allocated until the step ended:
    batch 4 at 32k on qwen3-8b asked 36 x 512 MiB and ran out of memory (H100). Grown outside
    graph capture only (a captured step that needs more takes the split decode kernel);
    older buffers are kept, as captured graphs may point at them (at most 64 MiB + 1 GiB)."""

    def __init__(self) -> None:
        self.bufs: list[DeviceArray] = []

    def get(self, ctx, nbytes: int) -> DeviceArray | None:
        if self.bufs and self.bufs[-1].nbytes >= nbytes:
            return self.bufs[-1]
        if ctx.backend.capturing or nbytes > GATHER_MAX_BYTES:
            return None
        size = GATHER_FIRST_BYTES if nbytes <= GATHER_FIRST_BYTES else GATHER_MAX_BYTES
        self.bufs.append(ctx.backend.empty((size,), np.uint8))
        return self.bufs[-1]


def gather(ctx, scratch: DeviceArray, k_cache: DeviceArray, v_cache: DeviceArray,
           block_tables: DeviceArray, seq_lens: DeviceArray, head_dim: int, dtype) -> tuple:
    """Dense ``(k, v, block_tables)`` in ``scratch`` (at least :func:`gather_bytes` plus the
    table): every sequence's blocks dequantized into scratch blocks ``b * max_blocks + j``
    (blocks past its length zeroed) and the table naming them."""
    num_seqs, max_blocks = block_tables.shape
    _, bs, kh, _ = k_cache.shape
    check_row("paged_attention", k_cache, head_dim)
    shape = (num_seqs * max_blocks, bs, kh, head_dim)
    half = gather_bytes(num_seqs, max_blocks, bs, kh, head_dim, dtype) // 2
    k = DeviceArray(scratch.ptr, shape, dtype, scratch)
    v = DeviceArray(scratch.ptr + half, shape, dtype, scratch)
    table = DeviceArray(scratch.ptr + 2 * half, (num_seqs, max_blocks), np.int32, scratch)
    if num_seqs * max_blocks:
        ctx.launch(ctx.kernel("kv_nvfp4", dtype, "kv_nvfp4_gather"), num_seqs * max_blocks, 128,
                   k, v, table, k_cache, v_cache, block_tables, seq_lens, max_blocks, bs, kh,
                   head_dim)
    return k, v, table
