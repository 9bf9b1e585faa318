"""``python -m hpctrain ARGS`` in a child held to an address-space limit, reporting its own peak resident memory:
for the tests that hand the commands files declaring huge shapes, FIFOs and absurd flags (a command that reads
what it should refuse hits the limit, never the machine's memory; a hang ends at the timeout)."""

from __future__ import annotations

import os
import re
import resource
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ADDRESS_SPACE = 3 << 30  # torch's import maps ~0.7 GB; reading a volume that was to be refused needs far more
_PEAK = "hpctrain-test-peak-rss-kb"
# The peak is the process's own high-water mark (VmHWM): getrusage's ru_maxrss also counts the pages of the
# forked test process it was started from (preexec_fn needs a fork), which the command never touched.
_WRAPPER = (
    "import atexit, runpy, sys\n"
    "def peak():\n"
    "    with open('/proc/self/status') as f:\n"
    "        kb = next(line.split()[1] for line in f if line.startswith('VmHWM:'))\n"
    f"    sys.stderr.write('\\n{_PEAK} ' + kb + '\\n')\n"
    "atexit.register(peak)\n"
    "sys.argv = ['hpctrain', *sys.argv[1:]]\n"
    "runpy.run_module('hpctrain', run_name='__main__', alter_sys=True)\n"
)


@dataclass(frozen=True)
class Done:
    """A finished command: exit code, stdout, stderr (without the peak line) and its peak resident memory."""

    returncode: int
    stdout: str
    stderr: str
    peak_mb: float

    def one_line_error(self) -> str:
        """The error line of a refusal; asserts it is one line, no traceback, and a non-zero exit."""
        assert self.returncode != 0, self.stdout[-2000:] + self.stderr[-2000:]
        assert "Traceback" not in self.stderr, self.stderr[-3000:]
        lines = [line for line in self.stderr.splitlines() if line.strip()]
        errors = [line for line in lines if "error:" in line]
        assert len(errors) == 1, self.stderr[-3000:]
        return errors[0]


def _limit() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def hpctrain(*args: str, timeout: float = 120, env: dict[str, str] | None = None) -> Done:
    """Run ``hpctrain ARGS`` under the limit (stdin closed, this repository first on the path, no HPCTRAIN_*
    variables of the caller's but those in ``env``)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("HPCTRAIN_", "RANK", "WORLD_SIZE"))}
    base.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", **(env or {}))
    proc = subprocess.run([sys.executable, "-c", _WRAPPER, *args], cwd=REPO, env=base, capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL, preexec_fn=_limit)
    found = re.search(rf"\n{_PEAK} (\d+)\n", proc.stderr)
    stderr = proc.stderr.replace(found.group(0), "\n") if found else proc.stderr
    return Done(proc.returncode, proc.stdout, stderr, int(found.group(1)) / 1024 if found else float("nan"))
