"""Built wheels: kernel sources inside, `atlas-core>=0.1,<1` pins, and a clean install.

The name ``atlas-core`` on PyPI belongs to an unrelated 2018 project (1.2.0); every
distribution that needs our core pins ``atlas-core>=0.1,<1`` so a resolver never picks it.
The wheels are built from a copy of the workspace (the ``kernels`` links resolve there as in a
checkout), so the working tree gets no ``build/`` folders.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PLUGINS = ["atlas-cuda", "atlas-gb10", "atlas-hopper", "atlas-qwen3", "atlas-qwen35"]
KERNEL_SUFFIXES = (".cu", ".cuh", ".toml")
_SKIP = shutil.ignore_patterns("__pycache__", "build", "*.egg-info", "tests", "dist")

pytestmark = pytest.mark.timeout(600)


def _pip(*args: str, python: str = sys.executable, **kwargs) -> subprocess.CompletedProcess:
    proc = subprocess.run([python, "-m", "pip", *args], capture_output=True, text=True, **kwargs)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    """Wheels of atlas-core and the plugins, built with ``pip wheel --no-deps``."""
    src, out = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("dist")
    shutil.copytree(ROOT / "kernels", src / "kernels", symlinks=True)
    shutil.copytree(ROOT / "atlas_core", src / "atlas_core", ignore=_SKIP)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for name in PLUGINS:
        shutil.copytree(ROOT / "plugins" / name, src / "plugins" / name, symlinks=True,
                        ignore=_SKIP)
    _pip("wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(src),
         *(str(src / "plugins" / name) for name in PLUGINS), timeout=300)
    return out


def _wheel(dist: Path, name: str) -> zipfile.ZipFile:
    found = sorted(dist.glob(name.replace("-", "_") + "-*.whl"))
    assert found, f"no wheel for {name} in {sorted(p.name for p in dist.iterdir())}"
    return zipfile.ZipFile(found[-1])


def _requires(wheel: zipfile.ZipFile) -> list[str]:
    meta = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
    return [line.split(":", 1)[1].strip() for line in wheel.read(meta).decode().splitlines()
            if line.startswith("Requires-Dist:")]


@pytest.mark.parametrize("name", PLUGINS)
def test_wheel_ships_its_kernel_sources(dist, name):
    package = ROOT / "plugins" / name / name.replace("-", "_")
    expected = {str(Path(folder, file).relative_to(package.parent))
                for folder, _, files in os.walk(package, followlinks=True) for file in files
                if file.endswith(KERNEL_SUFFIXES)}
    if name != "atlas-qwen3":
        assert expected, f"{name} has no kernel sources under {package}"
    shipped = set(_wheel(dist, name).namelist())
    assert expected - shipped == set(), f"{name}'s wheel lacks kernel sources"


@pytest.mark.parametrize("name", PLUGINS)
def test_plugin_wheels_pin_our_core(dist, name):
    pins = [r for r in _requires(_wheel(dist, name)) if re.match(r"atlas-(core|cuda)\b", r)]
    assert pins, f"{name} requires neither atlas-core nor atlas-cuda"
    for pin in pins:
        assert pin.split(";")[0].replace(" ", "") in ("atlas-core<1,>=0.1", "atlas-cuda<1,>=0.1")


def test_cublas_extra_brings_the_cublaslt_library(dist):
    """nvmath-python holds only the bindings; without a CUDA toolkit, libcublasLt comes from
    the nvidia-cublas wheel (CUDA 13, matching cuda-bindings and nvidia-cuda-nvrtc)."""
    extra = [r.split(";")[0].replace(" ", "") for r in _requires(_wheel(dist, "atlas-cuda"))
             if 'extra == "cublas"' in r]
    assert any(r.startswith("nvidia-cublas>=13") for r in extra), extra
    assert any(r.startswith("nvmath-python>=0.7") for r in extra), extra


def test_every_workspace_pyproject_pins_our_core():
    for path in [*ROOT.glob("plugins/*/pyproject.toml"), *ROOT.glob("examples/*/pyproject.toml")]:
        deps = tomllib.loads(path.read_text())["project"]["dependencies"]
        ours = [d for d in deps if re.match(r"atlas-(core|cuda)\b", d)]
        assert ours and all(">=0.1,<1" in d for d in ours), f"{path}: {ours}"


def _pypi_reachable() -> bool:
    try:
        socket.create_connection(("pypi.org", 443), timeout=5).close()
        return True
    except OSError:
        return False


def _squatter(tmp_path: Path) -> Path:
    """A stand-in for the unrelated ``atlas-core 1.2.0`` on PyPI, so the check holds offline of
    what PyPI serves."""
    folder = tmp_path / "squatter"
    folder.mkdir()
    info = "atlas_core-1.2.0.dist-info"
    with zipfile.ZipFile(folder / "atlas_core-1.2.0-py3-none-any.whl", "w") as whl:
        whl.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: atlas-core\n"
                                          "Version: 1.2.0\n")
        whl.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\n"
                                      "Root-Is-Purelib: true\nTag: py3-none-any\n")
        whl.writestr(f"{info}/RECORD", "")
    return folder


needs_pypi = pytest.mark.skipif(not _pypi_reachable(), reason="PyPI is not reachable")


@needs_pypi
def test_resolver_picks_our_core_over_the_unrelated_one(dist, tmp_path):
    links = ["--find-links", str(dist), "--find-links", str(_squatter(tmp_path))]
    report = tmp_path / "report.json"
    _pip("install", "--dry-run", "--ignore-installed", "-q", "--report", str(report), *links,
         "atlas-core", "atlas-gb10", "atlas-qwen35", timeout=300)
    picked = {i["metadata"]["name"]: i["metadata"]["version"]
              for i in json.loads(report.read_text())["install"]}
    assert picked["atlas-core"] == "0.1.0"
    assert {"atlas-cuda", "atlas-gb10", "atlas-qwen35"} <= set(picked)
    _pip("install", "--dry-run", "--ignore-installed", "--no-deps", "-q", "--report", str(report),
         *links, "atlas-core", timeout=300)
    alone = json.loads(report.read_text())["install"][0]["metadata"]["version"]
    assert alone == "1.2.0", "without a plugin's pin the unrelated release wins"


@pytest.mark.slow
@needs_pypi
def test_wheels_install_in_a_clean_venv(dist, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    _pip("install", "-q", "--find-links", str(dist), "atlas-core", "atlas-gb10", "atlas-qwen35",
         python=python, timeout=500)
    proc = subprocess.run([str(venv / "bin" / "atlas"), "plugins", "--json", "--strict"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    names = {p["name"] for p in json.loads(proc.stdout)["plugins"]}
    assert {"cuda", "qwen35"} <= names, names
    check = ("import atlas_core, atlas_cuda, atlas_gb10; from pathlib import Path; "
             "print(Path(atlas_core.__file__).parent, "
             "len(list(Path(atlas_cuda.__file__).parent.glob('kernels/common/*.cu'))), "
             "atlas_gb10.target().name)")
    proc = subprocess.run([python, "-c", check], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    where, num_kernels, target = proc.stdout.split()
    assert str(venv) in where and int(num_kernels) > 10 and target == "gb10"


def test_every_kernel_file_is_package_data():
    """Every .cu / .cuh / .toml under a workspace package is matched by its pyproject's
    package-data globs, so the wheel ships it (atlas-nemotron-h's wheel once lacked the header
    its Mamba-2 kernels include)."""
    import fnmatch
    for path in [*ROOT.glob("plugins/*/pyproject.toml"), ROOT / "pyproject.toml"]:
        data = tomllib.loads(path.read_text()).get("tool", {}).get("setuptools", {}).get(
            "package-data", {})
        for package in [p for p in path.parent.iterdir() if (p / "__init__.py").is_file()]:
            globs = data.get(package.name, [])
            for f in package.rglob("*"):
                if f.suffix not in (".cu", ".cuh", ".toml") or "egg-info" in str(f):
                    continue
                rel = f.relative_to(package).as_posix()
                assert any(fnmatch.fnmatch(rel, g) or fnmatch.fnmatch(rel, g.replace("**/", ""))
                           for g in globs), f"{path}: {package.name}/{rel} is not package data"
