"""Runs a command between it and Slurm's PMI server, recording the PMI-1 requests it sends (a test instrument).

``python pmi_relay.py OUT_DIR COMMAND...`` under ``srun --mpi=pmi2``: the command gets its own end of a socket
pair as ``PMI_FD``; every byte is relayed both ways unchanged, and OUT_DIR/pmi-RANK.json says how many requests
the rank sent, the longest request line (with its newline) and whether MPICH split a value into segments.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path


def main(out_dir: str, command: list[str]) -> int:
    upstream = socket.socket(fileno=int(os.environ["PMI_FD"]))
    ours, theirs = socket.socketpair()
    seen = {"requests": 0, "longest": 0, "segments": False}

    def pump(src: socket.socket, dst: socket.socket, record: bool) -> None:
        pending = b""
        while data := src.recv(65536):
            dst.sendall(data)
            if not record:
                continue
            pending += data
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                seen["requests"] += 1
                seen["longest"] = max(seen["longest"], len(line) + 1)
                seen["segments"] = seen["segments"] or (line.startswith(b"cmd=put") and b"-seg-" in line)

    sent = threading.Thread(target=pump, args=(ours, upstream, True), daemon=True)
    sent.start()
    threading.Thread(target=pump, args=(upstream, ours, False), daemon=True).start()
    child = subprocess.Popen(command, env={**os.environ, "PMI_FD": str(theirs.fileno())}, pass_fds=(theirs.fileno(),))
    theirs.close()
    code = child.wait()
    sent.join(timeout=10)
    rank = os.environ.get("SLURM_PROCID", "0")
    Path(out_dir, f"pmi-{rank}.json").write_text(json.dumps(seen))
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
