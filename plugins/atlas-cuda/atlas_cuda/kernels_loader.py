"""KernelLibrary: compiled, loaded kernels of one target, and launching them."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from atlas_cuda.array import DeviceArray
from atlas_cuda.compiler import KernelSources, compile_module
from atlas_cuda.driver import check, drv
from atlas_cuda.targets import Target

_VARIANT_OF = {"bfloat16": "bf16", "float16": "f16", "float32": "f32"}


def variant_of(dtype: Any) -> str:
    """Kernel dtype variant (``bf16``/``f16``/``f32``) for a NumPy dtype, with a clear error."""
    name = np.dtype(dtype).name
    if name not in _VARIANT_OF:
        raise TypeError(f"the cuda backend has no kernels for dtype {name}; "
                        "use bfloat16, float16 or float32")
    return _VARIANT_OF[name]


def kernel_arg(a: Any) -> Any:
    """Convert one launch argument: arrays and None become pointers, Python scalars 32-bit."""
    if isinstance(a, DeviceArray):
        return np.uint64(a.ptr)
    if a is None:
        return np.uint64(0)
    if isinstance(a, (bool, int)) and not isinstance(a, np.generic):
        return np.int32(a)
    if isinstance(a, float):
        return np.float32(a)
    return a


def kernel_family(name: str) -> str:
    """A kernel's name without its dtype variant (``gemvn_bf16_m1_g4`` -> ``gemvn_m1_g4``)."""
    return re.sub(r"_(bf16|f16|f32)(_|$)", r"\2", name)


def module_global(module: Any, symbol: str) -> int | None:
    """Device address of ``__device__`` variable ``symbol`` of a loaded module (``ObjectCode``),
    or None where the module has none (profiling arrays: ``atlas_profile``, ``atlas_trace``)."""
    d = drv()
    handle = module.handle
    getter = d.cuLibraryGetGlobal if isinstance(handle, d.CUlibrary) else d.cuModuleGetGlobal
    err, ptr, _size = getter(handle, symbol.encode())
    return int(ptr) if err == d.CUresult.CUDA_SUCCESS else None


class KernelLibrary:
    """Compiles modules on first use (through the disk cache) and caches loaded kernels.

    Sources are searched in the target's folders (most specific first, then the generic
    ``kernels/cuda/common``), then in ``extra_dirs``: the folders plugins registered with
    ``register_kernel_sources``, so a plugin's modules include ``common.cuh`` and a target may
    override them by file name.
    """

    def __init__(self, target: Target, backend: Any, model: str | None = None,
                 quant: str | None = None, cache_dir: Path | None = None,
                 extra_dirs: Sequence[Path] = ()) -> None:
        self.target = target
        self.backend = backend
        self.sources = KernelSources([*target.search_dirs(model, quant), *extra_dirs])
        self.cache_dir = cache_dir
        self.modules: dict[tuple[str, str], Any] = {}
        self.kernels: dict[tuple[str, str, str], Any] = {}
        self.pdl_supported = True
        self._module_of: dict[int, str] = {}
        #: Module of the kernel launched last (on this library's stream; captures included).
        self.last_module: str | None = None

    def kernel(self, module: str, variant: str, name: str, max_shmem: int = 0) -> Any:
        key = (module, variant, name)
        k = self.kernels.get(key)
        if k is None:
            optin = int(getattr(self.backend, "smem_optin", 0) or 0)
            if optin and max_shmem > optin:
                raise ValueError(
                    f"kernel {name} ({module}.cu) needs {max_shmem:,} bytes of shared memory a "
                    f"block; this GPU allows {optin:,} (sized for Hopper's 227 KB: the op should "
                    "have checked OpContext.fits_smem and taken a smaller kernel; please report "
                    "it with the model and the step's shapes)")
            mod = self.modules.get((module, variant))
            if mod is None:
                from cuda.core import ObjectCode
                arch = self.target.hardware.get("module_arch", {}).get(module, self.target.arch)
                cubin = compile_module(self.sources, module, variant, arch, self.cache_dir)
                mod = self.modules[(module, variant)] = ObjectCode.from_cubin(cubin)
            k = self.kernels[key] = mod.get_kernel(name)
            self._module_of[id(k)] = module
            if max_shmem > 48 << 10:
                _set_max_shmem(k, max_shmem, self.backend.device.device_id)
        return k

    def launch(self, kernel: Any, grid: Any, block: Any, *args: Any, shmem: int = 0,
               pdl: bool = False, cluster: Any = None) -> None:
        """Launch on the backend's stream; ``pdl``: programmatic dependent launch (the kernel
        must call ``pdl_wait()`` before reading anything the previous kernel wrote);
        ``cluster``: thread block cluster shape (sm_90+; ``grid`` then counts clusters, as
        cuda.core's LaunchConfig does)."""
        from cuda.core import LaunchConfig, launch
        self.last_module = self._module_of.get(id(kernel))
        extra = {} if cluster is None else {"cluster": cluster}
        config = None
        if pdl and self.pdl_supported:
            try:
                config = LaunchConfig(grid=grid, block=block, shmem_size=shmem,
                                      programmatic_stream_serialization=True, **extra)
            except TypeError:  # cuda.core without PDL
                self.pdl_supported = False
        if config is None:
            config = LaunchConfig(grid=grid, block=block, shmem_size=shmem, **extra)
        launch(self.backend.stream_obj, config, kernel, *[kernel_arg(a) for a in args])


def _set_max_shmem(kernel: Any, nbytes: int, device_id: int) -> None:
    d = drv()
    attr = d.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    handle = kernel.handle
    if isinstance(handle, d.CUkernel):
        check(d.cuKernelSetAttribute(attr, nbytes, handle, device_id))
    else:
        check(d.cuFuncSetAttribute(handle, attr, nbytes))
