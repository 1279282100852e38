"""The contract tests generated from registered op specs.

An :class:`~atlas_core.ops.spec.OpSpec` with ``cases="pkg.module:attr"`` names a callable
returning :class:`OpCase` objects (inputs as host arrays). :class:`GeneratedOpContract` runs
every case of every registered spec on the backend under test, when the backend's table has
the op, and compares with the spec's reference: the output(s), and for in-place or stateful
ops every array argument afterwards (state pools NaN-poisoned where an op must not write stay
NaN). A plugin that registers an op with cases gets it tested on every backend that
implements it, without writing a test class.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from atlas_core.ops.registry import OpRegistry
from atlas_core.plugins import resolve
from atlas_core.testing.contracts_ops import assert_close, to_device, to_host


@dataclass
class OpCase:
    """One contract case of an op.

    Attributes:
        id: a short name of the case (pytest id: ``<op>-<id>``).
        args, kwargs: the op's arguments, NumPy arrays on the host (a list of arrays is
            uploaded array by array: the pools of the block-copy ops).
        tol_scale: multiplies the dtype's tolerance (state recurrences amplify rounding).
    """

    id: str
    args: tuple
    kwargs: dict[str, Any] = field(default_factory=dict)
    tol_scale: float = 1.0


def registered_cases(registry: OpRegistry) -> list[tuple[str, OpCase]]:
    """``(op name, case)`` for every case of every registered spec that declares cases."""
    out = []
    for name in registry.names():
        spec = registry.spec(name)
        if spec.cases is not None:
            out += [(name, case) for case in resolve(spec.cases)()]
    return out


def _copy(x: Any) -> Any:
    if isinstance(x, list):
        return [_copy(y) for y in x]
    return x.copy() if isinstance(x, np.ndarray) else x


def check_case(backend, registry: OpRegistry, name: str, case: OpCase) -> None:
    """Run ``case`` through ``backend.ops.<name>`` and the reference, and compare."""
    spec = registry.spec(name)
    dev_args = [to_device(backend, a) for a in case.args]
    dev_kwargs = {k: to_device(backend, v) for k, v in case.kwargs.items()}
    out = to_host(backend, getattr(backend.ops, name)(*dev_args, **dev_kwargs))
    ref_args = [_copy(a) for a in case.args]
    ref_kwargs = {k: _copy(v) for k, v in case.kwargs.items()}
    expected = registry.reference(name)(*ref_args, **ref_kwargs)
    if expected is not None:
        outs, exps = (out, expected) if isinstance(expected, tuple) else ((out,), (expected,))
        assert len(outs) == len(exps), f"{name}: {len(outs)} outputs, expected {len(exps)}"
        for i, (o, e) in enumerate(zip(outs, exps)):
            if e is None:  # an output the case does not ask for (Gemma's ffn_in experts_in)
                assert o is None, f"{name} output {i}: expected None"
                continue
            assert_close(o, e, f"{name} output {i}", case.tol_scale)
    if spec.writes_args:
        for i, (dev, host) in enumerate(zip(dev_args, ref_args)):
            pairs = zip(dev, host) if isinstance(host, list) else [(dev, host)]
            for j, (d, h) in enumerate(pairs):
                if isinstance(h, np.ndarray):
                    what = f"{name} argument {i}" + (f"[{j}]" if isinstance(host, list) else "")
                    assert_close(backend.to_host(d), h, what, case.tol_scale)


def backend_registry(backend) -> OpRegistry:
    """The ops ``backend`` was built from (``backend.op_registry``), else a fresh registry."""
    registry = getattr(backend, "op_registry", None)
    return registry if registry is not None else OpRegistry.load()


class GeneratedOpContract:
    """Tests generated from the registered op specs (mixed into ``GpuBackendContract``)."""

    def pytest_generate_tests(self, metafunc):
        if "op_case" in metafunc.fixturenames:
            cases = registered_cases(OpRegistry.load())
            metafunc.parametrize("op_case", cases, ids=[f"{n}-{c.id}" for n, c in cases])
        if "op_name" in metafunc.fixturenames:
            metafunc.parametrize("op_name", OpRegistry.load().names())

    def test_registered_op(self, backend, op_case):
        name, case = op_case
        if name not in backend.ops:
            pytest.skip(f"the backend has no {name!r}")
        check_case(backend, backend_registry(backend), name, case)

    def test_op_signature(self, backend, op_name):
        if op_name not in backend.ops:
            pytest.skip(f"the backend has no {op_name!r}")
        got = inspect.signature(getattr(backend.ops, op_name)).parameters
        want = inspect.signature(backend_registry(backend).reference(op_name)).parameters
        assert [(p.name, p.kind, p.default) for p in got.values()] == \
            [(p.name, p.kind, p.default) for p in want.values()], f"{op_name} signature differs"

