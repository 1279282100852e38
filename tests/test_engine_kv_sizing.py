"""KV-cache sizing from device memory, explicit sizes, and the errors that say what would fit."""

import numpy as np
import pytest

from atlas_core.engine import EngineArgs
from atlas_core.engine.kv_layers import NVFP4_PREFILL_SCRATCH
from atlas_core.engine.kv_sizing import kv_cache_dtype, plan_kv_cache
from atlas_core.interfaces import DeviceInfo, KVCacheSpec, RecurrentStateSpec
from atlas_core.ops._dtypes import bfloat16, float8_e4m3fn

GIB = 1 << 30


class Backend:
    kv_cache_dtypes = frozenset({"bf16", "fp8", "nvfp4"})

    def __init__(self, free, total, kind="cuda"):
        self.free, self.total, self.kind = free, total, kind

    def memory_info(self):
        return self.free, self.total

    def device_info(self):
        return DeviceInfo("test", self.kind, self.total)


class Model:
    dtype = bfloat16
    hidden_size = 1024
    vocab_size = 32000
    max_position_embeddings = 32768

    def __init__(self, specs=None):
        self.specs = specs or [KVCacheSpec(8, 128)] * 4

    def kv_cache_specs(self):
        return self.specs


# 4 layers * 2 (K, V) * 8 heads * 128 dims * 2 bytes * 16 tokens = 256 KiB per block
BLOCK = 4 * 2 * 8 * 128 * 2 * 16


def test_defaults_fill_the_budget_and_cap_max_seq_len():
    kv = plan_kv_cache(Backend(70 * GIB, 80 * GIB), Model(), EngineArgs())
    assert kv.bytes_per_block == BLOCK and kv.dtype == bfloat16
    assert 50 * GIB < kv.num_blocks * BLOCK < 62 * GIB
    assert kv.max_seq_len == 32768


def test_defaults_never_fail_when_memory_is_short():
    kv = plan_kv_cache(Backend(int(0.8 * GIB), 2 * GIB), Model(), EngineArgs(max_num_seqs=4))
    assert kv.max_seq_len == kv.num_blocks * 16 < 32768


def test_explicit_max_seq_len_too_long_says_what_fits():
    with pytest.raises(ValueError) as info:
        plan_kv_cache(Backend(int(0.8 * GIB), 2 * GIB), Model(),
                      EngineArgs(max_seq_len=32768, max_num_seqs=4))
    msg = str(info.value)
    assert "max_seq_len=32768 needs 2048 KV blocks" in msg
    assert "--max-seq-len" in msg and "--gpu-memory-utilization" in msg


def test_max_seq_len_beyond_the_model():
    with pytest.raises(ValueError, match="exceeds the model's max_position_embeddings"):
        plan_kv_cache(Backend(70 * GIB, 80 * GIB), Model(), EngineArgs(max_seq_len=40000))


def test_explicit_num_kv_blocks():
    kv = plan_kv_cache(Backend(70 * GIB, 80 * GIB), Model(), EngineArgs(num_kv_blocks=100))
    assert kv.num_blocks == 100 and kv.max_seq_len == 1600
    with pytest.raises(ValueError, match=r"num_kv_blocks=1000000 needs .* use --num-kv-blocks \d+"):
        plan_kv_cache(Backend(70 * GIB, 80 * GIB), Model(), EngineArgs(num_kv_blocks=1_000_000))


def test_fp8_halves_the_block():
    kv = plan_kv_cache(Backend(70 * GIB, 80 * GIB), Model(), EngineArgs(
        kv_cache_dtype="fp8", num_kv_blocks=10, kv_high_precision_layers="none"))
    assert kv.dtype == float8_e4m3fn and kv.bytes_per_block == BLOCK // 2
    # the default keeps the first and the last attention layer in bf16: 2 of 4 layers halved
    auto = plan_kv_cache(Backend(70 * GIB, 80 * GIB), Model(), EngineArgs(kv_cache_dtype="fp8",
                                                                          num_kv_blocks=10))
    assert auto.bytes_per_block == BLOCK * 3 // 4
    assert auto.dtype_summary == "fp8 (2 layers), bfloat16 (2 layers: 0, 3)"
    assert kv_cache_dtype("auto", np.float32) == np.float32
    assert kv_cache_dtype("bf16", np.float32) == bfloat16


def test_cpu_backends_keep_the_pool_small():
    kv = plan_kv_cache(Backend(500 * GIB, 512 * GIB, kind="cpu"), Model(), EngineArgs(max_num_seqs=2))
    assert kv.num_blocks == 2 * 32768 // 16


def test_no_memory_at_all():
    with pytest.raises(ValueError, match="no memory left for the KV cache"):
        plan_kv_cache(Backend(0, 2 * GIB), Model(), EngineArgs())


GDN = RecurrentStateSpec({"conv": (3, 1024), "ssm": (8, 128, 128)})
HYBRID = [KVCacheSpec(8, 128)] * 4 + [GDN] * 12
SLOT = 12 * (3 * 1024 + 8 * 128 * 128) * 4      # float32 state of one sequence


def test_recurrent_state_rows_come_off_the_kv_budget():
    attention_only = plan_kv_cache(Backend(70 * GIB, 80 * GIB), Model(), EngineArgs(max_num_seqs=8))
    kv = plan_kv_cache(Backend(70 * GIB, 80 * GIB), Model(HYBRID), EngineArgs(max_num_seqs=8))
    assert kv.state_bytes_per_slot == SLOT
    assert kv.num_state_slots == 8 and kv.num_state_snapshots == 8 and kv.num_state_rows == 16
    assert kv.bytes_per_block == BLOCK
    assert abs((attention_only.num_blocks - kv.num_blocks) * BLOCK - 16 * SLOT) < BLOCK
    no_cache = plan_kv_cache(Backend(70 * GIB, 80 * GIB), Model(HYBRID),
                             EngineArgs(max_num_seqs=8, enable_prefix_caching=False))
    assert no_cache.num_state_snapshots == 0 and no_cache.num_blocks > kv.num_blocks
    few = plan_kv_cache(Backend(70 * GIB, 80 * GIB), Model(HYBRID),
                        EngineArgs(max_num_seqs=8, num_state_snapshots=2))
    assert few.num_state_snapshots == 2
    assert attention_only.num_state_slots == 0 and attention_only.state_bytes_per_slot == 0


def test_recurrent_state_that_does_not_fit_says_what_to_lower():
    with pytest.raises(ValueError, match="state for 64 sequences .* lower --max-num-seqs"):
        plan_kv_cache(Backend(1 * GIB, 2 * GIB), Model(HYBRID), EngineArgs())
    with pytest.raises(ValueError, match="num_state_snapshots must be >= 0"):
        EngineArgs(num_state_snapshots=-1)


def test_recurrent_only_models_get_a_bounded_block_count():
    model = Model([RecurrentStateSpec({"ssm": (4, 4)})] * 2)
    kv = plan_kv_cache(Backend(70 * GIB, 80 * GIB), model, EngineArgs(max_num_seqs=2))
    assert kv.num_blocks == 2 * 32768 // 16


def test_recurrent_prefill_work_is_reserved_before_the_kv_pool():
    state = {"conv": (3, 256), "ssm": (4, 32, 32)}
    plain = [KVCacheSpec(8, 128), RecurrentStateSpec(state)]
    heavy = [KVCacheSpec(8, 128), RecurrentStateSpec(state, prefill_bytes_per_token=256 << 10)]
    args = EngineArgs(max_prefill_tokens=4096)
    a = plan_kv_cache(Backend(70 * GIB, 80 * GIB), Model(plain), args)
    b = plan_kv_cache(Backend(70 * GIB, 80 * GIB), Model(heavy), args)
    # 4096 + batch rows x 256 KiB = at least 1 GiB less for the pool, rounded to whole blocks
    assert (a.num_blocks - b.num_blocks) * b.bytes_per_block >= GIB


def test_explicit_blocks_beyond_what_the_sequences_need_are_allowed_on_cpu():
    # the CPU default caps the pool at max_seq_len x max_num_seqs; an explicit size only has to
    # fit in memory (it used to fail with "needs 0 MiB but only 8 blocks fit")
    kv = plan_kv_cache(Backend(8 * GIB, 16 * GIB, kind="cpu"), Model(),
                       EngineArgs(num_kv_blocks=16, max_seq_len=64, max_num_seqs=2))
    assert kv.num_blocks == 16


def test_nvfp4_rows_per_layer_and_the_high_precision_layers():
    model = Model([KVCacheSpec(8, 128)] * 36)
    bf16 = plan_kv_cache(Backend(70 * GIB, 80 * GIB), model, EngineArgs())
    none = plan_kv_cache(Backend(70 * GIB, 80 * GIB), model, EngineArgs(
        kv_cache_dtype="nvfp4", kv_high_precision_layers="none"))
    # 72 bytes a (token, head) row instead of 256: 3.56x the blocks at the same memory
    assert none.bytes_per_block * 256 == bf16.bytes_per_block * 72
    # the pool holds 3.56x the tokens in the same bytes; nvfp4 keeps its prefill scratch
    # (kv_layers.NVFP4_PREFILL_SCRATCH, 1 GiB) out of the pool as well
    assert 3.4 < none.num_blocks / bf16.num_blocks < 3.6
    assert (none.num_blocks * none.bytes_per_block + NVFP4_PREFILL_SCRATCH
            == pytest.approx(bf16.num_blocks * bf16.bytes_per_block, rel=1e-3))
    auto = plan_kv_cache(Backend(70 * GIB, 80 * GIB), model, EngineArgs(kv_cache_dtype="nvfp4"))
    assert auto.dtype_summary == "nvfp4 (34 layers), bfloat16 (2 layers: 0, 35)"
    assert auto.layer_dtype(0) == bfloat16 and auto.layer_dtype(1) == np.uint8
    assert auto.bytes_per_block == 16 * 2 * 8 * (34 * 72 + 2 * 256)
    listed = plan_kv_cache(Backend(70 * GIB, 80 * GIB), model, EngineArgs(
        kv_cache_dtype="nvfp4", kv_high_precision_layers="3,4,5,20"))
    assert listed.dtype_summary == "nvfp4 (32 layers), bfloat16 (4 layers: 3-5, 20)"


def test_nvfp4_errors_are_one_line():
    for bad in ("first", "0,x", "-1", ""):
        with pytest.raises(ValueError, match="kv_high_precision_layers must be auto, none"):
            EngineArgs(kv_high_precision_layers=bad)
    with pytest.raises(ValueError, match="kv_cache_dtype must be auto, bf16, fp8 or nvfp4"):
        EngineArgs(kv_cache_dtype="fp4")
    with pytest.raises(ValueError, match=r"layer\(s\) 7, 9 are not attention layers .*0-3"):
        plan_kv_cache(Backend(70 * GIB, 80 * GIB), Model(), EngineArgs(
            kv_cache_dtype="nvfp4", kv_high_precision_layers="1,7,9"))
    with pytest.raises(ValueError, match="layer 1: head_dim 80 is not a multiple of 32"):
        plan_kv_cache(Backend(70 * GIB, 80 * GIB), Model([KVCacheSpec(8, 64), KVCacheSpec(8, 80),
                                                          KVCacheSpec(8, 64)]),
                      EngineArgs(kv_cache_dtype="nvfp4", kv_high_precision_layers="none"))


def test_nvfp4_needs_a_backend_that_reads_it():
    class Fp8Only(Backend):
        kv_cache_dtypes = frozenset({"bf16", "fp8"})
    with pytest.raises(ValueError, match="backend does not read nvfp4 KV caches"):
        plan_kv_cache(Fp8Only(70 * GIB, 80 * GIB), Model(), EngineArgs(kv_cache_dtype="nvfp4"))


def test_latent_and_window_layers_keep_the_model_dtype_under_nvfp4():
    from atlas_core.engine.kv_layers import layer_kv_dtypes
    from atlas_core.interfaces.layer import LatentCacheSpec, SlidingWindowCacheSpec
    specs = [LatentCacheSpec.of(512, 64), KVCacheSpec(8, 128),
             SlidingWindowCacheSpec(8, 128, sliding_window=1024), None,
             RecurrentStateSpec({"ssm": (4, 4)}), KVCacheSpec(8, 128), KVCacheSpec(8, 128)]
    got = layer_kv_dtypes(specs, "nvfp4", bfloat16, "none")
    assert got == [bfloat16, np.dtype(np.uint8), bfloat16, None, None, np.dtype(np.uint8),
                   np.dtype(np.uint8)]
    # auto: the first and last attention layer of the decoder; an MTP layer after it is not
    auto = layer_kv_dtypes(specs, "nvfp4", bfloat16, "auto", num_layers=6)
    assert auto[0] == bfloat16 and auto[5] == bfloat16 and auto[6] == np.uint8
    # the model's own dtype: no layer differs, whatever the list says
    assert layer_kv_dtypes(specs, "auto", bfloat16, "1")[1] == bfloat16
