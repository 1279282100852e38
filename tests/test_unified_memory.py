"""Unified memory (GB10 / DGX Spark): KV sizing from MemAvailable keeps the system's share, and
the weights' pre-flight check compares against what is available now, not the total RAM."""

import logging

import numpy as np
import pytest

from atlas_core.engine import EngineArgs
from atlas_core.engine.kv_sizing import plan_kv_cache, system_reserve
from atlas_core.interfaces import DeviceInfo, KVCacheSpec
from atlas_core.ops._dtypes import bfloat16

GIB = 1 << 30
BLOCK = 4 * 2 * 8 * 128 * 2 * 16  # 4 layers x (K, V) x 8 heads x 128 dims x 2 bytes x 16 tokens


class Backend:
    def __init__(self, free, total, unified):
        self.free, self.total, self.unified = free, total, unified

    def memory_info(self):
        return self.free, self.total

    def device_info(self):
        return DeviceInfo("GB10", "cuda", self.total, "12.1", self.unified)


class Model:
    dtype = bfloat16
    hidden_size = 1024
    vocab_size = 32000
    max_position_embeddings = 32768

    def kv_cache_specs(self):
        return [KVCacheSpec(8, 128)] * 4


def test_system_reserve_is_at_least_4_gib_or_5_percent():
    assert system_reserve(16 * GIB) == 4 * GIB
    assert system_reserve(128 * GIB) == int(6.4 * GIB)


def test_unified_memory_keeps_the_system_share_whatever_the_utilization(caplog):
    # 128 GiB Spark, 20 GiB MemAvailable after the weights: util 0.99 would otherwise leave
    # the OS nothing
    args = EngineArgs(gpu_memory_utilization=0.99)
    with caplog.at_level(logging.INFO, logger="atlas_core.engine.kv_sizing"):
        kv = plan_kv_cache(Backend(20 * GIB, 128 * GIB, True), Model(), args)
    used = kv.num_blocks * BLOCK
    assert used <= 20 * GIB - system_reserve(128 * GIB)
    assert used > 10 * GIB
    assert "MemAvailable" in caplog.text and "kept for the system" in caplog.text
    # a discrete GPU with the same figures takes what the utilization allows
    discrete = plan_kv_cache(Backend(20 * GIB, 128 * GIB, False), Model(), args)
    assert discrete.num_blocks * BLOCK > used


def test_unified_memory_with_too_little_available_says_so():
    with pytest.raises(ValueError, match="no memory left for the KV cache"):
        plan_kv_cache(Backend(5 * GIB, 128 * GIB, True), Model(), EngineArgs())


def test_weights_preflight_uses_memavailable_on_unified_memory(tmp_path):
    from atlas_core.model.weight_loading import WeightLoadError, check_size
    from atlas_core.weights import Checkpoint
    from atlas_core.weights.safetensors_file import write_safetensors

    write_safetensors(tmp_path / "model.safetensors",
                      {"w": np.zeros((1024, 1024), np.float32)})
    ckpt = Checkpoint.open(tmp_path)
    params = 2 * 1024 * 1024  # 4 MiB of bf16 weights: fits any total, not 3 GiB available
    free = 4 * GIB + 2 * (1 << 20)
    check_size(params, bfloat16, ckpt, Backend(free, 128 * GIB, False))
    with pytest.raises(WeightLoadError, match="MemAvailable"):
        check_size(params, bfloat16, ckpt, Backend(free, 16 * GIB, True))
    check_size(params, bfloat16, ckpt, Backend(free + 8 * (1 << 20), 16 * GIB, True))
