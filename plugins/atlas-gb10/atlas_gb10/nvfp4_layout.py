"""Operand layout of GB10's block-scaled FP4 MMA as ``kernels/gb10/common/nvfp4_mma.cu`` uses
it, written once in NumPy: the scale swizzle done at load, which lane holds which fragment
word, and an emulation of one ``mma.sync.m16n8k64 ... kind::mxf4nvf4.block_scale.scale_vec::4X``
tile built from those same index functions (the host tests check it against a dequantized
matmul; the kernel itself is compile-checked, not run).

Words are ``uint32`` of eight E2M1 codes, element ``8 * w + j`` in bits ``4j..4j+3`` (the
checkpoint's packing: low nibble first). Lane ``l = 4 * g + t`` of a warp.
"""

from __future__ import annotations

import numpy as np

from atlas_core.api import E2M1_LUT

#: K elements of one MMA (a slab): 8 words per row, 4 group scales of 16.
SLAB = 64


def swizzle_scales(scale: np.ndarray) -> np.ndarray:
    """Row-major ``[rows, K/16]`` ue4m3 group scales -> the MMA's ``uint32 [K/64, rows]``:
    word ``(s, r)`` holds the scales of groups ``4s..4s+3`` of row ``r``, low byte first.

    Raises:
        ValueError: ``K/16`` not a multiple of 4 (K must be a multiple of 64), or a scale with
            its sign bit set (ue4m3 has none).
    """
    raw = np.ascontiguousarray(np.asarray(scale).view(np.uint8))
    rows, groups = raw.shape
    if groups % 4:
        raise ValueError(f"the FP4 MMA needs K a multiple of {SLAB}; got {groups * 16}")
    if (raw & 0x80).any():
        raise ValueError("NVFP4 block scales must be non-negative (ue4m3)")
    words = raw.reshape(rows, groups // 4, 4).copy().view("<u4")[..., 0]
    return np.ascontiguousarray(words.T)


def unswizzle_scales(words: np.ndarray) -> np.ndarray:
    """Inverse of :func:`swizzle_scales`: ``uint8 [rows, K/16]``."""
    w = np.ascontiguousarray(np.asarray(words, dtype="<u4").T)
    return w.view(np.uint8).reshape(w.shape[0], -1)


def a_word(lane: int, reg: int, slab: int) -> tuple[int, int]:
    """``(row, word)`` of the A tile (16 rows) that A register ``reg`` (0-3) of ``lane`` holds."""
    g, t = divmod(lane, 4)
    return g + 8 * (reg & 1), 8 * slab + t + 4 * (reg >> 1)


def b_word(lane: int, reg: int, slab: int) -> tuple[int, int]:
    """``(column, word)`` of the B tile (8 columns) that B register ``reg`` (0-1) holds."""
    g, t = divmod(lane, 4)
    return g, 8 * slab + t + 4 * reg


def scale_a_row(lane: int) -> int:
    """The A row whose four group scales ``lane`` passes (byte-id 0, thread-id 0)."""
    g, t = divmod(lane, 4)
    return g + 8 * (t & 1)


def scale_b_col(lane: int) -> int:
    """The B column whose four group scales ``lane`` passes."""
    return lane // 4


def c_index(lane: int, i: int) -> tuple[int, int]:
    """``(row, column)`` of accumulator ``i`` (0-3) of ``lane``."""
    g, t = divmod(lane, 4)
    return g + 8 * (i >> 1), 2 * t + (i & 1)


def unpack_words(words: np.ndarray) -> np.ndarray:
    """``uint32 [..., W]`` -> float32 E2M1 values ``[..., 8 W]``."""
    w = np.asarray(words, dtype=np.uint32)[..., None]
    codes = (w >> (4 * np.arange(8, dtype=np.uint32))) & 0xF
    return E2M1_LUT[codes].reshape(*w.shape[:-2], -1)


def ue4m3(raw: np.ndarray) -> np.ndarray:
    """float32 value of ue4m3 bytes."""
    from atlas_core.api import float8_e4m3fn
    return np.asarray(raw, dtype=np.uint8).view(float8_e4m3fn).astype(np.float32)


def lane_operands(xq: np.ndarray, xs: np.ndarray, wq: np.ndarray, ws: np.ndarray, m0: int,
                  n0: int, slab: int) -> tuple[np.ndarray, ...]:
    """What each lane of the warp computing rows ``m0..m0+15``, columns ``n0..n0+7`` passes
    to the MMA of ``slab``, read as the kernel reads it: ``(a [32, 4], b [32, 2], sa [32],
    sb [32])`` from packed words ``xq [M, K/8]``, ``wq [N, K/8]`` and swizzled scales
    ``xs [K/64, M]``, ``ws [K/64, N]``."""
    a = np.array([[xq[m0 + r, w] for r, w in (a_word(lane, i, slab) for i in range(4))]
                  for lane in range(32)], dtype=np.uint32)
    b = np.array([[wq[n0 + c, w] for c, w in (b_word(lane, i, slab) for i in range(2))]
                  for lane in range(32)], dtype=np.uint32)
    sa = np.array([xs[slab, m0 + scale_a_row(lane)] for lane in range(32)], dtype=np.uint32)
    sb = np.array([ws[slab, n0 + scale_b_col(lane)] for lane in range(32)], dtype=np.uint32)
    return a, b, sa, sb


def mma_emulate(c: np.ndarray, a: np.ndarray, b: np.ndarray, sa: np.ndarray,
                sb: np.ndarray) -> np.ndarray:
    """One MMA as the hardware defines it, gathering the tiles back from the lanes' registers
    by the index functions above: ``c [32, 4] + (A * SA) @ (B * SB).T`` scattered to lanes."""
    tile_a = np.zeros((16, 8), np.uint32)
    tile_b = np.zeros((8, 8), np.uint32)
    scales_a = np.zeros((16, 4), np.float32)
    scales_b = np.zeros((8, 4), np.float32)
    for lane in range(32):
        for i in range(4):
            r, w = a_word(lane, i, 0)
            tile_a[r, w] = a[lane, i]
        for i in range(2):
            col, w = b_word(lane, i, 0)
            tile_b[col, w] = b[lane, i]
        scales_a[scale_a_row(lane)] = ue4m3(np.array([sa[lane]], "<u4").view(np.uint8))
        scales_b[scale_b_col(lane)] = ue4m3(np.array([sb[lane]], "<u4").view(np.uint8))
    va = unpack_words(tile_a) * np.repeat(scales_a, 16, axis=1)
    vb = unpack_words(tile_b) * np.repeat(scales_b, 16, axis=1)
    d = va @ vb.T
    out = np.array(c, dtype=np.float32, copy=True)
    for lane in range(32):
        for i in range(4):
            out[lane, i] += d[c_index(lane, i)]
    return out


def quantize_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``nvfp4_act_quant``: float ``x [M, K]`` -> ``(words uint32 [M, K/8], group scales uint8
    [M, K/16] (row-major; swizzle for the MMA), row scales float32 [M])``: groups scaled to
    amax / 6 under the row's amax / (6 * 448); codes rounded to the nearest E2M1 value, ties
    to the larger magnitude (the kernel's comparisons)."""
    from atlas_core.api import fp8_codes
    x = np.asarray(x, dtype=np.float32)
    m, k = x.shape
    amax = np.abs(x).max(axis=1)
    g = np.where(amax > 0, amax / np.float32(6 * 448), 1).astype(np.float32)
    groups = x.reshape(m, k // 16, 16)
    sc = fp8_codes(np.abs(groups).max(axis=2) / (np.float32(6) * g[:, None]))
    s = sc.astype(np.float32) * g[:, None]
    v = groups * np.where(s > 0, 1 / np.where(s > 0, s, 1), 0)[..., None]
    a = np.abs(v)
    mag = sum((a >= t).astype(np.uint32) for t in (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0))
    codes = (mag | np.where(v < 0, 8, 0).astype(np.uint32)).reshape(m, k // 8, 8)
    words = (codes << (4 * np.arange(8, dtype=np.uint32))).sum(axis=2, dtype=np.uint32)
    return words.astype(np.uint32), sc.view(np.uint8), g


def gemm_emulate(xq, xs, xg, wq, ws, wg: float, M: int, N: int, K: int) -> np.ndarray:
    """``nvfp4_gemm`` over whole 16 x 8 warp tiles, tile by tile and slab by slab from the
    lanes' operands (``xs``, ``ws`` swizzled), then its epilogue: float32 ``[M, N]``."""
    y = np.zeros((M, N), np.float32)
    for m0 in range(0, M, 16):
        for n0 in range(0, N, 8):
            c = np.zeros((32, 4), np.float32)
            for s in range(K // SLAB):
                c = mma_emulate(c, *lane_operands(xq, xs, wq, ws, m0, n0, s))
            for lane in range(32):
                for i in range(4):
                    r, col = c_index(lane, i)
                    y[m0 + r, n0 + col] = c[lane, i] * xg[m0 + r] * wg
    return y
