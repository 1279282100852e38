"""Speculative decoding: n-gram and MTP drafts verified exactly in one step per sequence.

:class:`SpeculativeConfig` (``config.py``) holds the settings, :class:`Speculator`
(``speculator.py``) plans drafts into a step and settles the sequences after it, the gate
(``gate.py``) decides from measured acceptance how many drafts pay off, and ``ngram.py`` drafts
by prompt lookup. docs/serving.md ("Speculative decoding") has the user's view.
"""

from atlas_core.engine.spec.config import SpeculativeConfig
from atlas_core.engine.spec.gate import SpecGate
from atlas_core.engine.spec.ngram import NgramProposer, ngram_drafts
from atlas_core.engine.spec.speculator import SpecStats, Speculator, num_accepted

__all__ = ["NgramProposer", "SpecGate", "SpecStats", "SpeculativeConfig", "Speculator",
           "ngram_drafts", "num_accepted"]
