"""The tensor-core MLA decode plan (no GPU): which kernel ``ATLAS_MLA_DECODE`` picks at each
latent shape, that each layout's resident blocks fit the SM's shared memory with the deepest
ring that fits, that the context splits make one wave, and that the configs match the
``.cu`` instantiations they launch."""

from __future__ import annotations

import re

import pytest

from atlas_deepseek.cuda import kernel_dir
from atlas_deepseek.cuda.mla_decode_plan import (KEYS2_DECODE_CONFIGS, KEYS_DECODE_CONFIGS,
                                                 MMA_DECODE_CONFIGS, RESERVED, _shared_bytes,
                                                 decode_plan, decode_splits)

#: opt-in shared memory per block: H100 / H200, A100, sm_89
HOPPER, AMPERE, ADA = 227 * 1024, 163 * 1024, 99 * 1024


@pytest.mark.parametrize("choice, kernel", [("", "mla_decode_keys2x2"),
                                            ("keys2", "mla_decode_keys2"),
                                            ("keys2x2", "mla_decode_keys2x2"),
                                            ("keys1", "mla_decode_keys"),
                                            ("v1", "mla_decode_mma"),
                                            ("unknown", "mla_decode_keys2x2")])
def test_the_choice_picks_the_kernel_at_mistral_small_4(choice, kernel):
    plan = decode_plan(256, 64, HOPPER, choice)
    assert plan.config.kernel == kernel and plan.stages == 4


@pytest.mark.parametrize("choice", ("", "keys2x2", "keys1", "v1"))
def test_deepseek_v3_always_takes_the_width_split_kernel(choice):
    assert decode_plan(512, 64, HOPPER, choice).config.kernel == "mla_decode_mma"
    assert decode_plan(128, 64, HOPPER, choice) is None


@pytest.mark.parametrize("optin", (HOPPER, AMPERE, ADA))
@pytest.mark.parametrize("choice", ("", "keys2x2", "keys1", "v1"))
@pytest.mark.parametrize("shape", ((256, 64), (512, 64)))
def test_resident_blocks_fit_the_sm_with_the_deepest_ring(optin, choice, shape):
    plan = decode_plan(*shape, optin, choice)
    if plan is None:
        return
    config, stages = plan.config, plan.stages

    def fits(s: int) -> bool:
        shmem, static = _shared_bytes(config, *shape, s)
        return config.blocks_per_sm * (shmem + static + RESERVED) <= optin + RESERVED

    assert fits(stages) and (stages == 4 or not fits(stages + 1))
    assert plan.shmem == _shared_bytes(config, *shape, stages)[0]


def test_the_pair_split_kernel_budgets_ring_exchange_and_merge():
    one, two = KEYS2_DECODE_CONFIGS[(256, 64)]
    row = (256 + 64 + 8) * 2
    # 32 query rows + 4 x 64 ring rows, then 8 pairs x 2 warps x 8 x 32 floats of scores.
    assert _shared_bytes(one, 256, 64, 4) == ((32 + 256) * row + 8 * 2048, 3 * 4 * 32 * 4)
    # Two stages: the merge buffer [4][32][264] floats is larger than ring + exchange.
    assert _shared_bytes(one, 256, 64, 2)[0] == 4 * 32 * 264 * 4
    plan = decode_plan(256, 64, AMPERE, "keys2x2")
    assert plan.config is two and plan.stages == 2


@pytest.mark.parametrize("batch, splits", [(1, 128), (8, 16), (32, 4), (200, 1)])
def test_splits_make_one_wave_of_one_block_an_sm(batch, splits):
    plan = decode_plan(256, 64, HOPPER, "keys2")
    assert decode_splits(plan, batch, 1, 132, 32768) == splits


@pytest.mark.parametrize("batch, splits", [(1, 256), (8, 33), (32, 8)])
def test_splits_make_one_wave_of_two_blocks_an_sm(batch, splits):
    plan = decode_plan(256, 64, HOPPER, "keys2x2")
    assert decode_splits(plan, batch, 1, 132, 32768) == splits


def test_short_tables_get_one_split_per_two_tiles():
    plan = decode_plan(256, 64, HOPPER, "keys2")
    assert decode_splits(plan, 1, 1, 132, 128) == 1
    assert decode_splits(plan, 1, 1, 132, 640) == 5


def _instances(module: str, macro: str) -> list[tuple[str, ...]]:
    """The arguments after (T, S) of each ``<macro>_ONE(T, S, ...)`` in ``<macro>``'s body."""
    text = (kernel_dir() / f"{module}.cu").read_text().replace("\\\n", " ")
    body = re.search(rf"#define {macro}\(T, S\)(.*)", text).group(1)
    found = [tuple(a.strip() for a in args.split(","))
             for args in re.findall(rf"{macro}_ONE\(T, S, ([^)]*)\)", body)]
    assert found, f"no {macro}_ONE in {module}.cu"
    return found


def test_configs_match_the_kernel_instantiations():
    # MLA_KEYS2_ONE(T, S, NAME, RANK, ROPE, MH, KW, MINB): warp pairs MH x KW.
    for name, rank, rope, mh, kw, minb in _instances("mla_decode_keys2", "MLA_KEYS2"):
        config = next(c for c in KEYS2_DECODE_CONFIGS[(int(rank), int(rope))] if c.kernel == name)
        mh, kw = int(mh), int(kw)
        assert (config.heads, config.warps, config.keys, config.blocks_per_sm) == \
            (16 * mh, 2 * mh * kw, 16 * kw, int(minb)), name
    # MLA_KEYS_ONE(T, S, RANK, ROPE, MH, KW): warps MH x KW.
    for rank, rope, mh, kw in _instances("mla_decode_keys", "MLA_KEYS"):
        config = KEYS_DECODE_CONFIGS[(int(rank), int(rope))]
        assert (config.heads, config.warps, config.keys) == \
            (16 * int(mh), int(mh) * int(kw), 16 * int(kw))
    # MLA_MMA_ONE(T, S, RANK, ROPE, MW, NW, BN): MW head tiles x NW width slices.
    for rank, rope, mw, nw, bn in _instances("mla_decode_mma", "MLA_MMA"):
        config = MMA_DECODE_CONFIGS[(int(rank), int(rope))]
        assert (config.heads, config.warps, config.keys) == \
            (16 * int(mw), int(mw) * int(nw), int(bn))
