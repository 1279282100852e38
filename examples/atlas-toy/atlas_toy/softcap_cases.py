"""Contract cases of ``toy_softcap``, named by its spec (``OpSpec(cases=...)``).

The generated contract test (:class:`atlas_core.testing.contracts_cases.GeneratedOpContract`)
runs each case on every backend whose op table has ``toy_softcap`` and compares the result with
the reference. Imported only by tests.
"""

from __future__ import annotations

from atlas_core.testing.contracts_cases import OpCase
from atlas_core.testing.contracts_ops import DTYPES, make_rng, randn

#: (shape, cap, input scale): values well inside the cap, around it, and saturating.
SHAPES_AND_CAPS = (((7, 64), 30.0, 1.0), ((3, 5, 40), 1.0, 1.0), ((1000,), 2.0, 8.0))


def toy_softcap_cases() -> list[OpCase]:
    """Every shape and cap of :data:`SHAPES_AND_CAPS` in every contract dtype."""
    cases = []
    for dtype in DTYPES:
        for shape, cap, scale in SHAPES_AND_CAPS:
            rng = make_rng("toy_softcap", dtype, shape, cap)
            x = randn(rng, shape, dtype, scale)
            cases.append(OpCase(f"{dtype}-{'x'.join(map(str, shape))}-cap{cap:g}", (x, cap)))
    return cases
