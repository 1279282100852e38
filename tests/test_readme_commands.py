"""README.md's commands run as written, in a temp dir, with the installed ``atlas``.

Every command of every fenced ``bash`` block is classified: installs and the test suite itself
are skipped, commands that need an NVIDIA GPU are skipped with that reason, ``atlas serve`` is
started as a server (on a free port, through ``ATLAS_PORT``) for the ``curl`` requests that
follow it, and everything else runs and must succeed. A command the test cannot classify fails
it, so a new README command gets a check. The ``python`` blocks run as scripts.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from atlas_core.testing.serving import free_port

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
README_PORT = "8888"

pytestmark = pytest.mark.timeout(300)

#: (pattern, reason) of commands that are not run here.
SKIPPED = [
    (r"^python3 -m venv ", "creates the venv this test already runs in"),
    (r"^\. \.venv/bin/activate$", "activates the venv this test already runs in"),
    (r"^pip install ", "installs the workspace this test already runs in"),
    (r"^pytest( |$)", "the test suite itself"),
    (r"^scripts/run_tests\.sh( |$)", "the test suite itself"),
    (r"--backend cuda\b", "needs an NVIDIA GPU and the atlas-cuda plugin"),
]

#: What the output of a command must show (pattern on stdout), beyond a zero exit status.
EXPECTED = {
    "atlas generate": r"(?s)--- prompt 'What is the capital of France\?'\n.*Paris",
    "atlas plugins": r"atlas-core",
    "atlas doctor": r"atlas-core",
}

#: What each README ``python`` block must print, in order.
PYTHON_EXPECTED = [r"\b42\b"]


def _blocks(language: str) -> list[str]:
    text = (ROOT / "README.md").read_text()
    return re.findall(rf"^```{language}\n(.*?)^```", text, flags=re.M | re.S)


def _commands(block: str) -> list[str]:
    joined = re.sub(r"\\\n\s*", " ", block)
    out = []
    for line in joined.splitlines():
        line = re.sub(r"\s+#\s.*$", "", line).strip()
        out += [part.strip() for part in line.split(" && ") if part.strip()] if line else []
    return out


def _skip_reason(command: str) -> str | None:
    return next((reason for pattern, reason in SKIPPED if re.search(pattern, command)), None)


def _env(tmp_path: Path, port: int) -> dict:
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
               ATLAS_PORT=str(port), ATLAS_BACKEND="numpy", HF_HUB_OFFLINE="1",
               HOME=str(tmp_path))
    env.pop("ATLAS_MODEL", None)
    return env


class _Server:
    def __init__(self, command: str, cwd: Path, env: dict) -> None:
        self.port = int(env["ATLAS_PORT"])
        self.log = open(cwd / "server.log", "w+")
        self.proc = subprocess.Popen(shlex.split(command), cwd=cwd, env=env, stdout=self.log,
                                     stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"server exited: {self._output()}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2):
                    return
            except OSError:
                time.sleep(0.3)
        raise AssertionError(f"server not ready in {timeout} s: {self._output()}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()

    def _output(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read()[-3000:]


def _check_curl(result: subprocess.CompletedProcess) -> None:
    body = json.loads(result.stdout)
    content = body["choices"][0]["message"]["content"]
    assert "521" in content and "<think>" not in content, body


def test_readme_has_the_commands_this_test_knows():
    commands = [c for block in _blocks("bash") for c in _commands(block)]
    assert any(c == "atlas serve" for c in commands)
    assert any(c.startswith("curl ") for c in commands)
    assert set(EXPECTED) <= {" ".join(c.split()[:2]) for c in commands}
    assert _blocks("python"), "README lost its Python example"


def test_readme_bash_commands(tmp_path):
    port = free_port()
    env = _env(tmp_path, port)
    server, skipped, ran = None, [], []
    try:
        for command in [c for block in _blocks("bash") for c in _commands(block)]:
            reason = _skip_reason(command)
            if reason:
                skipped.append((command, reason))
            elif command == "atlas serve":
                server = _Server(command, tmp_path, env)
                server.wait_ready()
            elif command.startswith("curl ") and shutil.which("curl") is None:
                skipped.append((command, "curl is not installed"))
            elif command.startswith("curl "):
                assert server is not None, "README runs curl before `atlas serve`"
                result = subprocess.run(command.replace(f":{README_PORT}/", f":{port}/"),
                                        shell=True, cwd=tmp_path, env=env, capture_output=True,
                                        text=True, timeout=120)
                assert result.returncode == 0, result.stderr
                _check_curl(result)
            elif command.startswith("atlas "):
                result = subprocess.run(command, shell=True, cwd=tmp_path, env=env,
                                        capture_output=True, text=True, timeout=120)
                assert result.returncode == 0, f"{command}: {result.stderr[-2000:]}"
                pattern = EXPECTED.get(" ".join(command.split()[:2]))
                if pattern:
                    assert re.search(pattern, result.stdout), f"{command}: {result.stdout}"
                assert "<think>" not in result.stdout, command
            else:
                raise AssertionError(f"README command this test does not cover: {command!r}; "
                                     "run it here or add it to SKIPPED with a reason")
            ran.append(command)
    finally:
        if server is not None:
            server.stop()
    assert len(ran) - len(skipped) >= 5, (ran, skipped)


@pytest.mark.parametrize("index", range(len(_blocks("python"))))
def test_readme_python_blocks(tmp_path, index):
    script = tmp_path / "snippet.py"
    script.write_text(_blocks("python")[index])
    result = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=_env(tmp_path, 0),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    expected = PYTHON_EXPECTED[index] if index < len(PYTHON_EXPECTED) else r"\S"
    assert re.search(expected, result.stdout), result.stdout
