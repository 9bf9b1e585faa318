"""ONE round trip to the login node: a POSIX sh script asks everything discovery needs, in marked sections.

Only the commands that exist run (``command -v``); each section keeps its command's stdout, stderr and exit
status apart. Every command runs under ``timeout`` where the login node has it and writes to temp files, not
to our pipe: a hung scheduler command, or a daemon a login shell leaves behind, costs its own section only.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from hpctrain.config.numbers import plain_count
from hpctrain.errors import TransportError
from hpctrain.submission.marked_sections import split_marked_sections
from hpctrain.submission.transport import Transport


class ProbedBackend(Protocol):
    """What the probe asks of a scheduler back-end (schedulers/base.py's Scheduler has it all); the caller hands the
    back-ends in, so this module needs none of them."""

    detect_programs: tuple[str, ...]
    probe_programs: tuple[str, ...]
    launch_programs: tuple[str, ...]
    probe_variables: tuple[str, ...]

    def probe_lines(self) -> list[str]: ...

MARK = "@@hpctrain-discover"
PROBE_TIMEOUT_S = 180.0
COMMAND_TIMEOUT_S = 40
# Launcher and MPI programs whose presence (and path) the probe reports, after the scheduler back-ends' own.
LAUNCH_PROGRAMS = ("aprun", "mpiexec", "mpirun")
# Launchers looked for in a login shell too, after the back-ends' own (``launch_programs``).
LOGIN_LAUNCH_PROGRAMS = ("mpiexec", "aprun")
_VARIABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Environment variables read on the login node: node-local scratch, module systems, MPI hints; the back-ends'
# own (``probe_variables``) follow.
VARIABLES = ("TMPDIR", "LOCAL_SCRATCH", "LOCALSCRATCH", "SCRATCH_LOCAL", "NODE_LOCAL_SCRATCH", "LOCAL_TMPDIR",
             "LOADEDMODULES", "LMOD_VERSION", "LMOD_CMD", "MODULESHOME", "MODULES_CMD", "PE_ENV",
             "CRAY_MPICH_VERSION")
# Directories that sites document as node-local scratch (Polaris /local/scratch, ThetaGPU /raid/scratch,
# Frontier's NVMe /mnt/bb); seen on the login node they are only a hint for the compute nodes.
SCRATCH_DIRS = ("/local/scratch", "/lscratch", "/scratch/local", "/raid/scratch", "/mnt/bb")

def probe_variables(backends: Sequence[ProbedBackend]) -> list[str]:
    """The environment variables the probe reads: the common ones, then every back-end's own."""
    return list(dict.fromkeys([*VARIABLES, *(v for b in backends for v in b.probe_variables)]))


def _prelude(programs: list[str], variables: list[str]) -> str:
    return f"""\
o=$(mktemp 2>/dev/null) || o="${{TMPDIR:-/tmp}}/hpctrain-discover-out.$$"
t=$(mktemp 2>/dev/null) || t="${{TMPDIR:-/tmp}}/hpctrain-discover-err.$$"
sec() {{ printf '\\n{MARK} %s\\n' "$*"; }}
have() {{ command -v "$1" >/dev/null 2>&1; }}
if have timeout; then T="timeout {COMMAND_TIMEOUT_S}"; else T=; fi
run() {{ n=$1; shift; $T "$@" </dev/null >"$o" 2>"$t"; rc=$?; sec "$n" out; cat "$o" 2>/dev/null; sec "$n" err; \
cat "$t" 2>/dev/null; sec "$n" rc "$rc"; return "$rc"; }}
u=$(id -un 2>/dev/null) || u=${{USER:-}}
sec host out; uname -n 2>/dev/null
sec user out; printf '%s\\n' "$u"
sec cpus out; getconf _NPROCESSORS_ONLN 2>/dev/null
sec memory out; while read -r k v rest; do [ "$k" = MemTotal: ] && printf '%s\\n' "$v"; done </proc/meminfo
sec programs out
for c in {" ".join(programs)}; do p=$(command -v "$c" 2>/dev/null) && printf '%s %s\\n' "$c" "$p"; done
sec variables out
for v in {" ".join(variables)}; do eval "x=\\${{$v-}}"; [ -n "$x" ] && printf '%s=%s\\n' "$v" "$x"; done
sec dirs out
for d in {" ".join(SCRATCH_DIRS)}; do [ -d "$d" ] && printf '%s\\n' "$d"; done
"""

# A login shell sees what `module` and the site's profile scripts set up; hpctrain's own ssh commands do not.
# Its output is read only from lines with these prefixes: profile scripts may print anything else.
def _login_shell(programs: list[str]) -> str:
    return ("printf 'LOADEDMODULES=%s\\n' \"${LOADEDMODULES-}\"\n"
            "type module >/dev/null 2>&1 && echo MODULE_COMMAND=yes\n"
            f"for c in {' '.join(programs)}; do\n"
            '  p=$(command -v "$c" 2>/dev/null) && echo "PROGRAM=$c $p"\n'
            "done")


def _schedulers(backends: Sequence[ProbedBackend]) -> str:
    """Each back-end's probe lines, under the first of them whose programs exist (``if ... elif ... fi``)."""
    lines: list[str] = []
    for backend in (b for b in backends if b.detect_programs):
        test = " || ".join(f"have {program}" for program in backend.detect_programs)
        lines.append(f"{'elif' if lines else 'if'} {test}; then")
        lines += [f"  {line}" for line in backend.probe_lines()] or ["  :"]
    return "\n".join([*lines, "fi", ""]) if lines else ""


def _tail(login_programs: list[str]) -> str:
    return f"""\
have mpiexec && run mpi_version mpiexec --version
have bash && run login bash -lc {shlex.quote(_login_shell(login_programs))}
rm -f "$o" "$t"
sec end
exit 0
"""


def probe_script(backends: Sequence[ProbedBackend]) -> str:
    """The whole probe (POSIX sh) asking ``backends`` (all_schedulers()); it always exits 0 and ends with the ``end``
    section."""
    detect = [p for b in backends for p in b.detect_programs]
    programs = list(dict.fromkeys([*detect, *(p for b in backends for p in b.probe_programs), *LAUNCH_PROGRAMS]))
    login = list(dict.fromkeys([*detect, *(p for b in backends for p in b.launch_programs), *LOGIN_LAUNCH_PROGRAMS]))
    return _prelude(programs, probe_variables(backends)) + _schedulers(backends) + _tail(login)


@dataclass(frozen=True)
class Section:
    """One command's answer; ``rc`` is None for the probe's own sections and for commands that never ran."""

    out: str = ""
    err: str = ""
    rc: int | None = None

    @property
    def ok(self) -> bool:
        return self.rc == 0


@dataclass(frozen=True)
class Probe:
    """The login node's answers, by section name (missing sections: the command does not exist there)."""

    sections: dict[str, Section] = field(default_factory=dict)

    def get(self, name: str) -> Section | None:
        return self.sections.get(name)

    def out(self, name: str) -> str:
        section = self.sections.get(name)
        return section.out if section else ""

    def answered(self, name: str) -> str | None:
        """The stdout of a command that ran and exited 0, else None."""
        section = self.sections.get(name)
        return section.out if section is not None and section.ok else None

    def failure(self, name: str) -> str | None:
        """``name`` failed: the first line of its stderr (usage text may follow), else its exit status; None
        when it answered or never ran."""
        section = self.sections.get(name)
        if section is None or section.rc is None or section.ok:
            return None
        lines = [ln.strip() for ln in (section.err or section.out).splitlines() if ln.strip()]
        if section.rc == 124:
            return f"no answer within {COMMAND_TIMEOUT_S} s"
        return lines[0] if lines else f"exit status {section.rc}"

    @property
    def programs(self) -> dict[str, str]:
        """Program name -> path on the login node, for the programs in PROGRAMS that exist."""
        found = {}
        for line in self.out("programs").splitlines():
            name, _, path = line.partition(" ")
            if name and path:
                found[name] = path.strip()
        return found

    @property
    def variables(self) -> dict[str, str]:
        found = {}
        for line in self.out("variables").splitlines():  # the probe prints only the variables it was asked for
            name, sep, value = line.partition("=")
            if sep and _VARIABLE_NAME.fullmatch(name):
                found[name] = value
        return found

    def login_shell(self) -> dict[str, list[str]]:
        """Values printed by the login shell, by prefix (LOADEDMODULES, MODULE_COMMAND, PROGRAM)."""
        found: dict[str, list[str]] = {}
        for line in self.out("login").splitlines():
            key, sep, value = line.partition("=")
            if sep and key in ("LOADEDMODULES", "MODULE_COMMAND", "PROGRAM"):
                found.setdefault(key, []).append(value.strip())
        return found


def _exit_status(text: str | None) -> int | None:
    """An exit status the probe printed (0-255, or negative for a signal); None when it is not one."""
    if text is None:
        return None
    value = plain_count(text.removeprefix("-"), 1024)
    return None if value is None else -value if text.startswith("-") else value


def probe_sections(stdout: str) -> dict[str, Section]:
    """The sections of the probe's output (``split_marked_sections``), each a Section with its exit status."""
    return {name: Section(part.get("out", ""), part.get("err", ""), _exit_status(part.get("rc")))
            for name, part in split_marked_sections(stdout, MARK).items()}


def run_probe(transport: Transport, backends: Sequence[ProbedBackend], timeout: float = PROBE_TIMEOUT_S) -> Probe:
    """Run the probe asking ``backends`` once through ``transport``; a probe that did not finish is a
    TransportError."""
    done = transport.run(["sh", "-c", probe_script(backends)], timeout=timeout, check=False)
    sections = probe_sections(done.stdout)
    if "end" not in sections:
        detail = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}, no output"])[-1]
        raise TransportError(f"the discovery probe on {transport.host} did not finish: {detail}",
                             hint="check that a POSIX sh runs there (`ssh HOST sh -c true`)")
    return Probe(sections)
