"""``atlas doctor``: what to paste into a bug report (works with or without a GPU)."""

from __future__ import annotations

import argparse
import platform
import sys


def add_parser(subparsers) -> argparse.ArgumentParser:
    return subparsers.add_parser("doctor", help="report GPU, driver, CUDA, kernels, cache, plugins")


def _gpu_lines() -> list[str]:
    try:
        from cuda.bindings import driver
    except ImportError:
        return ["cuda-python: not installed (pip install atlas-cuda)"]
    try:
        err, = driver.cuInit(0)
    except Exception as exc:  # noqa: BLE001 - no driver library on this machine
        return [f"CUDA driver: not found ({type(exc).__name__})"]
    if err != driver.CUresult.CUDA_SUCCESS:
        return [f"CUDA driver: unavailable ({err.name})"]
    _, version = driver.cuDriverGetVersion()
    _, count = driver.cuDeviceGetCount()
    lines = [f"CUDA driver API: {version // 1000}.{version % 1000 // 10}, {count} device(s)"]
    for i in range(count):
        _, dev = driver.cuDeviceGet(i)
        _, name = driver.cuDeviceGetName(64, dev)
        attr = driver.CUdevice_attribute
        _, major = driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)
        _, minor = driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)
        _, sms = driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev)
        _, mem = driver.cuDeviceTotalMem(dev)
        label = name.split(b"\0")[0].decode()
        lines.append(f"  GPU {i}: {label}, sm_{major}{minor}, {sms} SMs, "
                     f"{mem / 2**30:.1f} GiB")
    return lines


def _cublas_line() -> str:
    """Whether cuBLASLt (atlas-cuda's ``cublas`` extra) is usable: without it every matmul of more
    than one row runs the own mma.sync GEMM (docs/benchmarks.md, session 21)."""
    try:
        from nvmath.bindings import cublasLt
        return f"cuBLASLt: {cublasLt.get_version()} (nvmath-python)"
    except Exception as exc:  # noqa: BLE001 - not installed, or no library: report either
        why = "not installed" if isinstance(exc, ImportError) else f"unavailable ({exc})"
        return (f"cuBLASLt: {why}; pip install 'atlas-cuda[cublas]': without it prefill and "
                "decode batches above one run the own GEMM, about 2.5x slower at 8-32 sequences")


def _kernel_lines(registry=None) -> list[str]:
    from atlas_core import env
    lines = []
    try:
        from atlas_cuda.compiler import KernelSources, nvrtc_version
        from atlas_cuda.policy import target_policy
        from atlas_cuda.targets import generic_target, load_targets
    except ImportError:
        return ["kernel targets: atlas-cuda not installed"]
    try:
        lines.append(f"NVRTC: {nvrtc_version()}")
    except Exception as exc:  # noqa: BLE001 - report, don't crash
        lines.append(f"NVRTC: unavailable ({exc})")
    lines.append(_cublas_line())
    targets, broken = load_targets(registry)
    for t in targets + [generic_target((0, 0))]:
        mods = KernelSources(t.search_dirs()).modules()
        caps = ", ".join(".".join(map(str, c)) for c in t.compute_capabilities) or "any"
        lines.append(f"kernel target {t.name}: {t.arch if t.name != 'cuda' else 'device arch'} "
                     f"(GPUs {caps}), {len(mods)} modules")
        try:
            lines.append(f"  kernel policy: {target_policy(t).summary()}")
        except ValueError as exc:
            lines.append(f"  kernel policy: INVALID ({exc})")
    lines += [f"kernel target {name} FAILED: {error}" for name, error in broken]
    cache = env.cache_dir() / "kernels"
    n = len(list(cache.glob("*.cubin"))) if cache.is_dir() else 0
    lines.append(f"kernel cache: {cache} ({n} cubins)")
    return lines


def run(args) -> int:
    from atlas_core import __version__
    from atlas_core.plugins import Registry
    print(f"atlas {__version__}, Python {sys.version.split()[0]}, {platform.platform()}")
    reg = Registry()
    for line in _gpu_lines() + _kernel_lines(reg):
        print(line)
    for info in reg.plugins():
        things = "; ".join(f"{k}: {', '.join(v)}" for k, v in info.registered.items())
        print(f"plugin {info.name} ({info.dist or '?'}): {things or '-'}")
    for failure in reg.failures:
        print(f"plugin {failure.name} FAILED: {failure.error}")
    return 0
