"""``python -m hpctrain`` is the ``hpctrain`` command (used by rendered scripts to pick the interpreter).

``-m`` puts the working directory first on ``sys.path``; a rank's working directory is its run directory on the
shared file system, which the other ranks keep writing to, so every later import would list it again whenever its
time stamp changed (importlib re-reads a path entry whose mtime moved). It is taken off, as ``python -P`` would, so
``python -m hpctrain`` imports exactly what the ``hpctrain`` command does.
"""

import os
import sys

if sys.path and os.path.abspath(sys.path[0] or os.curdir) == os.getcwd():
    del sys.path[0]

from hpctrain.cli import main  # noqa: E402

sys.exit(main())
