"""``python -m helpers.deploy``: see ``helpers.deploy``."""

import sys

from . import DeployError, main

try:
    main()
except DeployError as exc:
    print(f"error: {exc}", file=sys.stderr)
    sys.exit(2)
