"""``python -m gyre_ma``: the ``gyre-ma`` command, run by this interpreter (a virtual
environment's, say, where the ``gyre-ma`` script on the PATH belongs to another)."""

import sys

from gyre_ma.cli import main

sys.exit(main())
