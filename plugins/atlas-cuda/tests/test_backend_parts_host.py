"""The cuda backend is assembled from parts (``transfers.py``: allocation and copies,
``graphs.py``: capture); no GPU: the parts' methods are the backend's, ``super()`` in a part
still reaches the ``GpuBackend`` defaults, and the moved names stay importable from
``atlas_cuda.backend``."""

from __future__ import annotations

import numpy as np

from atlas_cuda import backend as backend_mod
from atlas_cuda import graphs, transfers


class _Arr:
    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes


def test_the_parts_provide_the_backend_methods():
    cls = backend_mod.CudaBackend
    assert cls.copy_many is transfers.DeviceTransfers.copy_many
    assert cls.capture is graphs.GraphCapture.capture
    assert cls.supports_graphs is graphs.GraphCapture.supports_graphs
    assert not cls.__abstractmethods__


def test_moved_names_are_still_importable_from_backend():
    assert backend_mod.CudaGraph is graphs.CudaGraph
    assert backend_mod.ALIGN_MIN == graphs.ALIGN_MIN
    assert backend_mod.SMALL_COPY_BYTES == transfers.SMALL_COPY_BYTES


def test_copy_many_under_capture_falls_back_to_the_default_one_copy_at_a_time():
    be = backend_mod.CudaBackend.__new__(backend_mod.CudaBackend)
    be._capturing, calls = True, []
    be.copy_from_host = lambda dst, src: calls.append(("host", dst))
    be.copy_ = lambda dst, src: calls.append(("device", dst))
    a, b, c = _Arr(8), _Arr(4), _Arr(16)
    be.copy_many([(a, np.zeros(2, np.float32)), (b, np.zeros(1, np.int32))], [(c, _Arr(16))])
    assert calls == [("host", a), ("host", b), ("device", c)]
