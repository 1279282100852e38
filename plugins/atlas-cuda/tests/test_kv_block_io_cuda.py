"""KV tier transfers on CUDA beyond the shared contract (``test_contract_cuda.py`` runs the
gather_blocks / scatter_blocks cases, the async copies and the KVBlockIO / KVTiers round trips):
the kernels on a qwen3-8b-like layout with a 1 MiB state row split across thread blocks, and
pinned host arrays recognised, so their copies go straight to the device, queued; stream events
(``record_event``) complete after the copies before them and their handles are reused (the
contract's ``test_disk_restore_into_host_rows_never_synchronizes`` covers the tiers' use)."""

import numpy as np
import pytest

from atlas_core.api import bfloat16, reference
from cuda_probe import HAS_GPU

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HAS_GPU, reason="no CUDA device")]

#: 32 KiB K/V rows, a 1 MiB state row, rows of 60 and 6 bytes (unaligned offsets after them).
LAYOUT = [((16, 8, 128), bfloat16)] * 6 + [((256, 1024), np.float32), ((3, 5), np.float32),
                                           ((3,), np.float16)]
NUM_BLOCKS = 40


def test_kernels_match_the_reference_on_a_large_layout(cuda_backend):
    be = cuda_backend
    pools = []
    for i, (shape, dtype) in enumerate(LAYOUT):
        pools.append(be.empty((NUM_BLOCKS, *shape), dtype))
        be.fill_random(pools[-1], i, 1.0)
    host = [be.to_host(p) for p in pools]
    ids = np.random.default_rng(1).permutation(NUM_BLOCKS)[:29].astype(np.int32)
    width = sum(p.nbytes // NUM_BLOCKS for p in host)
    out = be.zeros((len(ids), width), np.uint8)
    be.ops.gather_blocks(pools, be.from_host(ids), out)
    want = np.empty((len(ids), width), np.uint8)
    reference.gather_blocks(host, ids, want)
    np.testing.assert_array_equal(be.to_host(out), want)
    rows = np.random.default_rng(2).integers(0, 255, want.shape, dtype=np.uint8)
    back = ids[::-1].copy()
    be.ops.scatter_blocks(be.from_host(rows), be.from_host(back), pools)
    reference.scatter_blocks(rows, back, host)
    for p, h in zip(pools, host):
        np.testing.assert_array_equal(be.to_host(p).view(np.uint8), h.view(np.uint8))


def test_pinned_arrays_are_recognised_and_copied_queued(cuda_backend):
    be = cuda_backend
    pinned = be.empty_pinned((8, 1 << 20), np.uint8)
    assert be.pinned.holds(pinned[5]) and be.pinned.holds(pinned[5][100:])
    assert not be.pinned.holds(np.empty(1 << 20, np.uint8))
    pinned[:] = 7
    dev = be.zeros((8, 1 << 20), np.uint8)
    be.copy_to_host_async(pinned[0], dev[0])        # queued: lands by synchronize()
    be.copy_from_host_async(dev[1], pinned[1])
    be.synchronize()
    assert (pinned[0] == 0).all() and (be.to_host(dev[1]) == 7).all()


def test_record_event_completes_after_the_copies_before_it_and_reuses_handles(cuda_backend):
    be = cuda_backend
    pinned = be.empty_pinned((64 << 20,), np.uint8)
    dev = be.zeros((64 << 20,), np.uint8)
    pinned[:] = 3
    be.copy_to_host_async(pinned, dev)               # 64 MiB queued into page-locked memory
    event = be.record_event()
    event.query()                                    # never blocks, done or not
    event.wait()
    assert event.query() and (pinned == 0).all()
    handle = event.handle
    del event
    assert be.record_event().handle == handle        # back on the free list, recorded again

