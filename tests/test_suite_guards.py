"""The workspace conftest's guard: a test that writes into CPython's shared one-byte ``bytes``
objects fails by name and the tests after it run against repaired objects (#30: NVRTC handed
``b" " * 1`` turned every later safetensors header's padding into NUL bytes)."""

from pathlib import Path

ROOT_CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"


def test_the_culprit_fails_and_later_tests_see_repaired_bytes(pytester):
    pytester.makeconftest(ROOT_CONFTEST.read_text())
    pytester.makepyfile(test_culprit='''
        import ctypes

        def test_writes_into_a_shared_byte():
            ctypes.memset(id(bytes([0x7e])) + bytes.__basicsize__ - 1, 0, 1)

        def test_runs_after_it():
            assert b"~" * 2 == bytes([126, 126])
    ''')
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    out = result.stdout.str()
    assert "FAILED test_culprit.py::test_writes_into_a_shared_byte" in out
    assert "overwrote CPython's shared one-byte bytes object(s) [b'~'] (now repaired)" in out
    assert b"~"[0] == 0x7e
