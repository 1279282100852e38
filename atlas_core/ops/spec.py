"""OpSpec: one op, declared once.

A spec names the op, points at its NumPy reference (the semantics every backend is tested
against; its docstring states shapes, dtypes and the formula), says whether it writes its
arguments, and optionally defines it in terms of other ops (``unfused``: what a backend without
a fused kernel runs) and where its contract cases live. Plugins register specs through the
``register_ops`` hook (:mod:`atlas_core.hookspecs`); references, unfused definitions and cases
may be lazy ``"package.module:attr"`` strings, resolved only when a backend builds its table or
a test asks for them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class OpSpec:
    """The declaration of one op.

    Attributes:
        name: the op's name across the ``.cu`` source, ``backend.ops.<name>``, the reference and
            its contract test; an identifier not starting with ``_``.
        reference: the NumPy reference (a callable or a lazy ``"pkg.module:attr"`` string).
            Every backend implementation has exactly its signature.
        inplace: the op writes into arrays it is given (a KV cache) rather than returning new
            ones.
        stateful: the op also updates state pools in place while returning a new array
            (recurrent layers).
        unfused: optional definition over other ops, ``unfused(ops, *args, **kwargs)`` where
            ``ops`` is the backend's op table; what a backend without its own implementation
            runs (fusions name the composition they replace).
        cases: optional lazy ``"pkg.module:attr"`` of a callable returning the contract cases
            (:class:`atlas_core.testing.contracts_cases.OpCase`) the generated contract test
            runs on every backend that has the op.
    """

    name: str
    reference: Callable[..., Any] | str
    inplace: bool = False
    stateful: bool = False
    unfused: Callable[..., Any] | str | None = None
    cases: str | None = None

    def __post_init__(self) -> None:
        if not self.name.isidentifier() or self.name.startswith("_"):
            raise ValueError(f"op name {self.name!r} must be a Python identifier not starting "
                             "with '_' (it becomes backend.ops.<name>)")

    @property
    def writes_args(self) -> bool:
        """Whether the op changes any array it is given (``inplace`` or ``stateful``)."""
        return self.inplace or self.stateful
