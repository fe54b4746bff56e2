"""``python -m helpers.doctor``: the setup check (see ``helpers.doctor``)."""

import sys

from . import main

sys.exit(main())
