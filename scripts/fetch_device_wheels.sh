#!/usr/bin/env bash
# The Python wheels a lent GPU machine lacks (its image has numpy, cuda-python, cupy, torch and
# transformers but not the serving stack, nvmath-python or nccl4py), downloaded into ./.whl for
# Python 3.12 manylinux; device calls carry ".whl" and install them with
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
#     --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
# The checkout of a new session has no .whl (it is in .git/info/exclude): run this first.
# Without nvmath-python every matmul of more than one row runs the own mma.sync GEMM: qwen3-8b
# batches 8-32 then decode about 2.5x slower (docs/benchmarks.md, session 21), so a bench
# without it does not measure the shipped configuration. Pins: what requirements-dev.txt
# resolved to on 2026-11-28 (newer ones work; keep one version of each).
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
platforms=()
for n in 17 24 27 28 31 34 35; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
for pkg in litestar==2.25.0 litestar-htmx==0.5.0 msgspec==0.22.0 uvicorn==0.54.0 \
           multipart==2.0.1 rich-click==1.9.9 sniffio==1.3.1 polyfactory==3.5.0 faker==40.63.0 \
           llguidance==1.9.1 nccl4py==0.6.0 nvmath-python==1.0.0 cuda-pathfinder==1.9.1; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp "${platforms[@]}" --platform manylinux2014_x86_64 --platform any \
    -d .whl "$pkg"
done
du -sh .whl
