"""``python -m backend.cli`` runs the ``strata`` command."""

import sys

from backend.cli import main

sys.exit(main())
