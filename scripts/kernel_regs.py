"""Registers, spills and shared memory of each kernel of a module, from ptxas (no GPU needed):

    python scripts/kernel_regs.py moe_block [bf16] [--hw hopper] [--grep mb_down] [-D X=1]
    python scripts/kernel_regs.py mla_decode_keys2 \
        --dir plugins/atlas-deepseek/atlas_deepseek/cuda/kernels

``--dir`` adds a plugin's kernel folder after the generic sources, as the cuda backend searches it.
``--sass`` also prints a hash of each kernel's machine code (its ``.text`` section of the
CUBIN): a refactor that leaves every hash unchanged compiles to the same instructions, so it
needs no new GPU test or timing.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import struct
import sys
from pathlib import Path


def text_sections(cubin: bytes) -> dict[str, bytes]:
    """``kernel name -> its .text.<name> section bytes`` of an ELF64 CUBIN."""
    shoff, = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    heads = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * shentsize) for i in range(shnum)]
    names_off = heads[shstrndx][4]
    out = {}
    for name_at, _type, _flags, _addr, off, size, *_ in heads:
        end = cubin.index(b"\0", names_off + name_at)
        name = cubin[names_off + name_at:end].decode()
        if name.startswith(".text."):
            out[name[len(".text."):]] = cubin[off:off + size]
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("module")
    p.add_argument("variant", nargs="?", default="bf16")
    p.add_argument("--hw", default="hopper", choices=("hopper", "gb10"))
    p.add_argument("--grep", default="")
    p.add_argument("-D", dest="defines", action="append", default=[],
                   help="an extra macro, NAME or NAME=VALUE (repeatable)")
    p.add_argument("--sass", action="store_true",
                   help="also print a hash of each kernel's machine code (CUBIN .text)")
    p.add_argument("--dir", dest="dirs", action="append", default=[], type=Path,
                   help="a plugin's kernel folder, searched after the generic ones (repeatable)")
    a = p.parse_args()
    from cuda.bindings import nvrtc
    from atlas_cuda import compiler
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from test_kernels_compile import TARGETS, _dirs
    sources = compiler.KernelSources(_dirs(a.hw) + a.dirs)
    opts = compiler.build_options(TARGETS[a.hw], a.variant)
    args = [f"-arch={opts['arch']}", "-std=c++17", "-Xptxas", "-v"]
    args += [f"-D{m}" if isinstance(m, str) else f"-D{m[0]}={m[1]}"
             for m in opts.get("define_macro", [])]
    args += [f"-D{d}" for d in a.defines]
    _, prog = nvrtc.nvrtcCreateProgram(sources.text(a.module + ".cu").encode(), b"k.cu", 0, [], [])
    err, = nvrtc.nvrtcCompileProgram(prog, len(args), [s.encode() for s in args])
    text = compiler.nvrtc_program_text(prog, "log")
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        sys.exit(text)
    name = None
    for line in text.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            name = m.group(1)
        if name and a.grep in name and ("Used" in line or "spill" in line):
            print(f"{name:40s} {line.split('info    :')[-1].strip()}")
    if a.sass:
        _, size = nvrtc.nvrtcGetCUBINSize(prog)
        cubin = bytearray(size)
        nvrtc.nvrtcGetCUBIN(prog, cubin)
        for kname, code in sorted(text_sections(bytes(cubin)).items()):
            if a.grep in kname:
                print(f"{kname:40s} sass {hashlib.sha256(code).hexdigest()[:16]} "
                      f"({len(code)} bytes)")


if __name__ == "__main__":
    main()
