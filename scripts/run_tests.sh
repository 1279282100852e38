#!/usr/bin/env bash
# The test suite, one pytest process per folder: the core tests, then each plugin's and each
# example's tests (pytest arguments pass through, e.g. `scripts/run_tests.sh -m slow`).
# One process per folder because a single `pytest -q` over everything currently corrupts
# safetensors files written late in the run (61 plugin loader tests fail after the core and
# Gemma-4 tests; each folder passes on its own): a cross-test leak still to be found.
set -uo pipefail
cd "$(dirname "$0")/.."
status=0
for dir in tests plugins/*/tests examples/*/tests; do
  [[ -d $dir ]] || continue
  echo "== $dir"
  python -m pytest -q -p no:cacheprovider "$dir" "$@"
  rc=$?
  [[ $rc -eq 0 || $rc -eq 5 ]] || status=1   # 5: no test selected in this folder
done
exit $status
