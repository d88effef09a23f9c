"""``python -m strata.cli`` runs the ``strata`` command."""

import sys

from strata.cli import main

sys.exit(main())
