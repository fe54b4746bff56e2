"""Shared, unit-tested helpers for the course notebooks.

Each module has one job, and helpers/README.md is the map: every module in one line, in
layers (imports only point down), with the chapters that use it. Import the module you need,
e.g. ``from helpers import run_sizes, data, models, training, measure``. Importing this
package is cheap: it loads no module until you ask for it.
"""

__all__ = [
    "run_sizes", "devices", "system", "data", "models", "published",
    "measure", "profiling", "plots", "training",
]
__version__ = "0.1.0"
