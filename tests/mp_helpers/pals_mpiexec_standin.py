"""A stand-in for PALS ``mpiexec`` under PBS Pro on one machine, for the node check: the check step (its command
runs ``hpctrain.nodes.check``) starts one check per host of ``$PBS_NODEFILE``, each posing as that host, the one
named in ``$BAD_NODE`` with a node-local directory under a file; any other launch records its argv and the
hosts of its ``--hostfile`` in ``$RECORD_DIR`` and exits 0. Used as ``mpiexec`` through a shim on PATH.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

argv = sys.argv[1:]
hosts = Path(os.environ["PBS_NODEFILE"]).read_text().split()
if "hpctrain.nodes.check" in argv:
    start = argv.index("-m") - 1  # the interpreter, after mpiexec's own options
    command = argv[start:]
    bad = os.environ.get("BAD_NODE", "")
    procs = [subprocess.Popen([*command, "--node-name", host,
                               *(["--local-dir", f"{sys.executable}/node-local:1"] if host == bad else [])])
             for host in hosts]
    sys.exit(max(p.wait() for p in procs))
hostfile = argv[argv.index("--hostfile") + 1] if "--hostfile" in argv else None
record = {"argv": argv, "hosts": Path(hostfile).read_text().split() if hostfile else hosts}
Path(os.environ["RECORD_DIR"], "launch.json").write_text(json.dumps(record))
