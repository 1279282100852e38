"""A bounded schemathesis pass over every operation of `/openapi.json` on the demo server: no
5xx, and statuses, content types and bodies as documented (issue #30)."""

from __future__ import annotations

import re
import signal
import subprocess
import sys

import httpx
import pytest

from test_server_support import wait_until

pytest.importorskip("schemathesis", reason="schemathesis is in the `test` extra")

CHECKS = ("not_a_server_error,status_code_conformance,content_type_conformance,"
          "response_schema_conformance")


@pytest.fixture(scope="module")
def demo_url():
    pytest.importorskip("atlas_qwen3", reason="the atlas-qwen3 plugin is not installed")
    cmd = [sys.executable, "-c", "import sys; from atlas_core.cli import main; sys.exit(main())",
           "serve", "--backend", "numpy", "--port", "0", "--max-seq-len", "64",
           "--no-access-log"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = re.search(r"(http://\S+)/v1", proc.stdout.readline()).group(1)
        assert wait_until(lambda: httpx.get(f"{url}/health").status_code == 200, timeout=120)
        yield url
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
        proc.stdout.close()
        proc.stderr.close()


def test_schemathesis_finds_nothing(demo_url, tmp_path):
    cmd = [sys.executable, "-c", "import sys; from schemathesis.cli import schemathesis; "
           "sys.exit(schemathesis())", "run", f"{demo_url}/openapi.json", "--checks", CHECKS,
           "--max-examples", "20", "--phases", "examples,fuzzing", "--workers", "2",
           "--suppress-health-check", "all", "--request-timeout", "30"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=tmp_path)
    report = run.stdout[-6000:]
    assert run.returncode == 0, report
    selected = re.search(r"(\d+) selected / (\d+) total", run.stdout)
    assert selected and selected.group(1) == selected.group(2), report
    assert re.search(r"\d+ generated, \d+ passed", run.stdout), report
