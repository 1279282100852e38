"""A real :class:`atlas_cuda.context.OpContext` over a fake backend that records launches
(no GPU needed): op classes run their host-side planning, kernels are never compiled."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from atlas_cuda.context import OpContext
from atlas_cuda.policy import KernelPolicy


class FakeArray:
    """Shape and dtype of an op output (the fake workspace hands these out)."""

    def __init__(self, shape, dtype):
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)


class FakeKernel:
    def __init__(self, module, name):
        self.module, self.name = module, name
        self.occupancy = self

    def max_active_blocks_per_multiprocessor(self, block, shmem):
        return 1 if "_w4_" in self.name else 2


class FakeKernels:
    """``KernelLibrary`` stand-in: ``launches`` holds ``(name, grid, shmem, args, pdl)``."""

    def __init__(self):
        self.launches, self.modules, self.last_module = [], {}, None

    def kernel(self, module, variant, name, *_):
        return FakeKernel(module, name)

    def launch(self, kernel, grid, block, *args, shmem=0, pdl=False, cluster=None):
        self.last_module = kernel.module
        self.launches.append((kernel.name, grid, shmem, args, pdl))


class FakeWorkspace:
    def alloc(self, shape, dtype):
        return FakeArray(shape, dtype)


class FakeBackend:
    """What :class:`OpContext` reads from a backend, and the few allocations ops make."""

    _capturing = False
    _probing = False

    @property
    def capturing(self):
        return self._capturing

    @property
    def probing(self):
        return self._probing

    def __init__(self, capability=(9, 0), num_sms=132):
        self.stream_obj, self.stream = None, 0
        self.capability, self.num_sms, self.l2_bytes = capability, num_sms, 50 << 20
        self.device = SimpleNamespace(device_id=0)

    def zeros(self, shape, dtype):
        return np.zeros(shape, dtype)

    def empty(self, shape, dtype):
        """A persistent buffer: its size and a null pointer (views of it are planned only)."""
        a = FakeArray(shape, dtype)
        a.ptr, a.nbytes = 0, int(np.prod(shape)) * np.dtype(dtype).itemsize
        return a


def fake_context(policy: KernelPolicy | None = None, backend=None) -> OpContext:
    """An :class:`OpContext` whose launches land in ``ctx.kernels.launches``."""
    return OpContext(backend or FakeBackend(), FakeKernels(), FakeWorkspace(),
                     policy or KernelPolicy())
