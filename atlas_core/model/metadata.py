"""Where :class:`StepMetadata` used to live; it is part of the layer contract now.

Import it from :mod:`atlas_core.interfaces` (or, in a plugin, :mod:`atlas_core.api`).
"""

from atlas_core.interfaces.metadata import StepMetadata

__all__ = ["StepMetadata"]
