"""Shared, unit-tested helpers for the course notebooks. A chapter imports ``lab`` (``from helpers import lab``)
and at most two topic modules; helpers/README.md is the map of the four areas. Importing this package is cheap:
it loads no module until you ask for it.
"""

__all__ = [
    "run_sizes", "devices", "system", "data", "models", "published",
    "measure", "profiling", "plots", "training",
]
__version__ = "0.1.0"
