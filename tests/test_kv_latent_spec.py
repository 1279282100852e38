"""``LatentCacheSpec`` (multi-head latent attention): one page pool of ``kv_lora_rank +
rope_dim`` values per token, counted once (not as K and V) by KV sizing, allocated as a
1-tuple, and moved whole by the KV block I/O of the tiers."""

from __future__ import annotations

import numpy as np

from atlas_core.api import KVCacheSpec, LatentCacheSpec
from atlas_core.engine.kv_block_io import KVBlockIO, paged_kv_pools
from atlas_core.engine.kv_sizing import bytes_per_block, kv_bytes_per_token
from atlas_core.backends.numpy_backend import NumpyBackend


def test_latent_spec_shape_and_pool_count():
    spec = LatentCacheSpec.of(512, 64)
    assert (spec.num_kv_heads, spec.head_dim, spec.kv_lora_rank, spec.rope_dim) == (1, 576, 512, 64)
    assert spec.num_pools == 1 and KVCacheSpec(8, 128).num_pools == 2
    assert isinstance(spec, KVCacheSpec)


def test_sizing_counts_the_latent_once():
    latent = [LatentCacheSpec.of(512, 64)] * 61
    assert kv_bytes_per_token(latent, np.dtype(np.uint16)) == 61 * 576 * 2
    assert bytes_per_block(latent, 16, np.dtype(np.uint16)) == 61 * 576 * 2 * 16
    mixed = [LatentCacheSpec.of(256, 64), KVCacheSpec(8, 128), None]
    assert kv_bytes_per_token(mixed, np.dtype(np.float32)) == (320 + 2 * 8 * 128) * 4


def test_block_io_moves_latent_pools_whole():
    backend = NumpyBackend()
    pool = backend.from_host(np.arange(4 * 8 * 1 * 40, dtype=np.float32).reshape(4, 8, 1, 40))
    io = KVBlockIO(backend, paged_kv_pools([(pool,), None]))
    assert io.block_bytes == 8 * 40 * 4
    payload = io.read([2])
    io.write([0], payload)
    np.testing.assert_array_equal(backend.to_host(pool)[0], backend.to_host(pool)[2])
