"""GPU probes for test suites (plugins' gpu tests skip, not fail, without a device).

Example (a plugin's ``tests/test_x_cuda.py``)::

    pytestmark = pytest.mark.gpu

    @pytest.fixture(scope="module")
    def cuda():
        return cuda_backend_or_skip()

Also here: :func:`assert_cuda_greedy_equals_numpy` (a checkpoint decodes the same on cuda as on
numpy), and the NVRTC compile checks of a plugin's kernels, which need atlas-cuda and
cuda-python but no device (a plugin's ``tests/test_x_kernels_compile.py``)::

    compiler = nvrtc_compiler_or_skip()

    def test_the_kernels_compile():
        sources = plugin_kernel_sources(kernel_dir())
        assert_kernel_module_found(sources, "x")
        assert_kernel_module_compiles(sources, "x", "sm_90a")
"""

from __future__ import annotations

import functools
from os import PathLike
from typing import Any, Sequence


@functools.cache
def cuda_device_count() -> int:
    """CUDA devices the driver reports when atlas-cuda is installed; 0 without either."""
    try:
        import atlas_cuda  # noqa: F401 - a plugin's [cuda] extra
        from cuda.bindings import driver
        if driver.cuInit(0)[0] != driver.CUresult.CUDA_SUCCESS:
            return 0
        err, count = driver.cuDeviceGetCount()
        return count if err == driver.CUresult.CUDA_SUCCESS else 0
    except Exception:  # noqa: BLE001 - no driver, no library
        return 0


def cuda_device_available() -> bool:
    """Whether a CUDA device and atlas-cuda are usable."""
    return cuda_device_count() > 0


def cuda_backend_or_skip(registry: Any = None) -> Any:
    """A ``cuda`` GpuBackend from ``registry`` (default: every installed plugin), or skip the
    calling test when there is no device or no atlas-cuda."""
    import pytest

    if not cuda_device_available():
        pytest.skip("no CUDA device, or atlas-cuda is not installed")
    if registry is None:
        from atlas_core.plugins import Registry
        registry = Registry()
    return registry.create("gpu_backends", "cuda")


def greedy_completions(path: str | PathLike, backend: str, prompts: Sequence[Sequence[int]],
                       **llm_kwargs: Any) -> list:
    """The first completion of each prompt: 32 greedy tokens with the top-3 logprobs, from an
    :class:`~atlas_core.llm.LLM` of ``path`` on ``backend`` (64 KV blocks of 8 tokens, 4
    sequences, 16-token prefill chunks; ``llm_kwargs`` add to these)."""
    from atlas_core.engine.sampling_params import SamplingParams
    from atlas_core.llm import LLM

    llm = LLM(str(path), backend=backend, num_kv_blocks=64, max_num_seqs=4, block_size=8,
              max_prefill_tokens=16, **llm_kwargs)
    params = SamplingParams(temperature=0, max_tokens=32, logprobs=3, ignore_eos=True)
    return [o.outputs[0] for o in llm.generate([{"prompt_token_ids": p} for p in prompts], params)]


def assert_cuda_greedy_equals_numpy(path: str | PathLike, prompts: Sequence[Sequence[int]],
                                    atol: float = 1e-4, **llm_kwargs: Any) -> None:
    """The checkpoint at ``path`` decodes the same :func:`greedy_completions` of ``prompts`` on
    cuda as on numpy: the same tokens, top logprobs within ``atol``."""
    import numpy as np

    got = greedy_completions(path, "cuda", prompts, **llm_kwargs)
    want = greedy_completions(path, "numpy", prompts, **llm_kwargs)
    for g, w in zip(got, want):
        assert g.token_ids == w.token_ids
        for lg, lw in zip(g.logprobs, w.logprobs):
            np.testing.assert_allclose([v for _, v in lg.top], [v for _, v in lw.top], atol=atol)


def nvrtc_compiler_or_skip() -> Any:
    """``atlas_cuda.compiler``, or skip the calling test module (call it at module level) when
    cuda-python's ``cuda.core`` or atlas-cuda is not installed."""
    import pytest

    pytest.importorskip("cuda.core")
    return pytest.importorskip("atlas_cuda.compiler")


def plugin_kernel_sources(kernel_dir: str | PathLike) -> Any:
    """A plugin's kernels as the cuda backend finds them: a ``KernelSources`` searching
    atlas-cuda's generic ``common`` sources (``common.cuh``...) first, then ``kernel_dir``."""
    from atlas_cuda.compiler import KernelSources
    from atlas_cuda.targets import generic_kernel_dir

    return KernelSources([generic_kernel_dir() / "common", kernel_dir])


def assert_kernel_module_found(sources: Any, module: str) -> None:
    """``module`` is a module of ``sources`` and its ``.cu`` file is the plugin's (found in the
    last directory searched)."""
    assert module in sources.modules()
    assert sources.find(f"{module}.cu").parent == sources.search_dirs[-1]


def assert_kernel_module_compiles(sources: Any, module: str, arch: str,
                                  variants: Sequence[str] | None = None) -> None:
    """Each of ``variants`` (default: every dtype variant ``module`` declares) of ``module``
    compiles with NVRTC for ``arch`` (``"sm_90a"``...) to a non-empty cubin."""
    from atlas_cuda import compiler

    for variant in sources.variants(module) if variants is None else variants:
        assert len(compiler.compile_module(sources, module, variant, arch, None)) > 0
