"""``python -m helpers.tune --model FILE.py:FUNC --out DIR``: see ``helpers.tune.search``."""

import sys

from .search import main

if __name__ == "__main__":
    sys.exit(main())
