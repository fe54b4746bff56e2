"""Command line of the tuner: ``python -m helpers.tune --model FILE.py:FUNC --out DIR`` (``helpers.tune.search.main``)."""

import sys

from .search import main

if __name__ == "__main__":
    sys.exit(main())
