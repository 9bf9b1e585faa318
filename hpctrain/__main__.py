"""``python -m hpctrain`` is the ``hpctrain`` command (used by rendered scripts to pick the interpreter)."""

import sys

from hpctrain.cli import main

sys.exit(main())
