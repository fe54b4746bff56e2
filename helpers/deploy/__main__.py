"""``python -m helpers.deploy``: serve a model with other engines (see ``helpers.deploy``)."""

import sys

from . import DeployError, main

try:
    main()
except DeployError as exc:
    print(f"error: {exc}", file=sys.stderr)
    sys.exit(2)
