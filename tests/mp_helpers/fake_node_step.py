"""A stand-in for the launcher's node check step on one machine: starts ``python -m hpctrain.nodes.check`` once per
node name given, each posing as that node (``--node-name``), with the extra arguments given for it.

python fake_node_step.py NODE[=ARG,ARG...] ...   (a node named ``-`` is started as nothing: it never reports)
"""

from __future__ import annotations

import subprocess
import sys

procs = []
for item in sys.argv[1:]:
    name, _, extra = item.partition("=")
    if name == "-":
        continue
    argv = [sys.executable, "-m", "hpctrain.nodes.check", "--timeout", "60", "--import", "json",
            "--node-name", name, *(a for a in extra.split(",") if a)]
    procs.append(subprocess.Popen(argv))
sys.exit(max((p.wait() for p in procs), default=0))
