"""Device pools of a planned KV cache: one entry per layer, in the layout the model binds.

:func:`~atlas_core.engine.kv_sizing.plan_kv_cache` decides how many blocks and state rows fit;
this turns that plan into arrays once, at start-up, so the runner's steps allocate nothing.
The per-layer choices live here because every one of them changes a pool's shape or dtype:
a layer's own KV dtype (``--kv-high-precision-layers``; nvfp4 layers get packed ``uint8`` rows,
:func:`~atlas_core.engine.kv_layers.pool_width`), the sliding-window pool's block count for
windowed layers, and the recurrent-state rows (live slots, then prefix snapshots) of hybrid
models.
"""

from __future__ import annotations

from typing import Any

from atlas_core.engine.kv_layers import pool_width
from atlas_core.engine.kv_sizing import KVCacheConfig, kv_specs
from atlas_core.engine.window_blocks import is_windowed
from atlas_core.interfaces.layer import KVCacheSpec, RecurrentStateSpec
from atlas_core.ops._dtypes import as_dtype


def allocate_kv_caches(model: Any, backend: Any, kv: KVCacheConfig) -> tuple[list, list]:
    """``(kv_caches, state_pools)`` for ``model`` on ``backend``.

    ``kv_caches[layer]`` is what ``model.bind_kv_caches`` takes: a tuple of ``spec.num_pools``
    paged pools ``[num_blocks, block_size, num_kv_heads, width]`` for attention layers, a dict
    ``name -> [num_state_rows, *shape]`` for recurrent-state layers, ``None`` for layers with
    no cache. ``state_pools`` lists every recurrent pool, for the snapshot row copies.
    """
    caches: list = []
    state_pools: list = []
    for layer, spec in enumerate(kv_specs(model)):
        if isinstance(spec, RecurrentStateSpec):
            if not kv.num_state_slots:
                raise ValueError("recurrent-state layers need state slots; plan the KV cache "
                                 "with kv_sizing.plan_kv_cache")
            pools = {name: backend.zeros((kv.num_state_rows, *shape), as_dtype(spec.dtype))
                     for name, shape in spec.shapes.items()}
            state_pools.extend(pools.values())
            caches.append(pools)
        elif isinstance(spec, KVCacheSpec):
            blocks = kv.num_blocks
            if kv.window_pool is not None and is_windowed(spec):
                blocks = kv.window_pool.num_blocks
            dtype = kv.layer_dtype(layer)
            shape = (blocks, kv.block_size, spec.num_kv_heads, pool_width(spec, dtype))
            # Zeroed: kernels may read whole blocks past a sequence's end (masked, but NaN * 0).
            caches.append(tuple(backend.zeros(shape, dtype) for _ in range(spec.num_pools)))
        else:
            caches.append(None)
    return caches, state_pools
