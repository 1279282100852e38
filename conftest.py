"""Checks that hold for every test of the workspace (core, plugins, examples).

A test that writes into CPython's shared one-byte ``bytes`` objects (a C library handed
``b" " * 1`` as an output buffer, as NVRTC once was) fails by name, and the shared objects are
put back, so the tests after it are not run against a broken interpreter (#30).
"""

from __future__ import annotations

import ctypes

import pytest

pytest_plugins = ["pytester"]

# ob_sval, the first byte of a bytes object's data, ends PyBytesObject's fixed part.
_DATA_OFFSET = bytes.__basicsize__ - 1


def damaged_byte_singletons() -> list[int]:
    """Values ``i`` whose shared ``bytes([i])`` no longer holds ``i``."""
    return [i for i in range(256) if bytes([i])[0] != i]


def _repair(values: list[int]) -> None:
    for i in values:
        ctypes.memset(id(bytes([i])) + _DATA_OFFSET, i, 1)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    result = yield
    damaged = damaged_byte_singletons()
    if damaged:
        _repair(damaged)
        pytest.fail(f"this test (or its fixtures) overwrote CPython's shared one-byte bytes "
                    f"object(s) {[bytes([i]) for i in damaged]} (now repaired): a C function "
                    "was handed an immutable bytes object as an output buffer, e.g. "
                    "b' ' * size for a size of 1; pass a bytearray instead", pytrace=False)
    return result
