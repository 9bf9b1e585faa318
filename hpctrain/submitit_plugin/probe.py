"""Before a callable waits in a queue: can the job's Python load it?

The pickle of a submission names the modules it needs (a callable from an installed package is pickled by
reference; one from ``__main__`` by value, which needs cloudpickle). One command on the login node asks the
job's interpreter whether it finds each of them, the runner and cloudpickle, and which Python version it is,
where the job looks for them: in an empty directory (as the run directory is when the ranks start), with the
directories the runner puts first on ``sys.path``. What is missing becomes one error naming the interpreter,
the machine, the module, where this process found it, and how to make the job find it.
"""

from __future__ import annotations

import os
import pickletools
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hpctrain.errors import ConfigError
from hpctrain.submission.module_probe import import_location, parse_answer, probe_argv
from hpctrain.submission.shell import quote_path
from hpctrain.submission.transport import Transport
from hpctrain.submitit_plugin.runner import DELAYED_CLASS, MODULE

PROBE_TIMEOUT_S = 60.0
# What every job's Python needs: the runner (hpctrain, torch-free) and cloudpickle to load the callable.
ALWAYS = (MODULE, "cloudpickle")
_INSTALL = {
    "hpctrain": "pip install hpctrain (the runner is torch-free: the base install is enough)",
    "cloudpickle": "pip install cloudpickle",
    "submitit": "pip install 'submitit>=1.5,<1.6' (the callable uses submitit, e.g. helpers.Checkpointable)",
}
_STRING_OPS = {"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "SHORT_BINSTRING", "BINSTRING",
               "STRING"}


def referenced_globals(data: bytes) -> set[tuple[str, str]]:
    """The (module, name) pairs a pickle imports when it is loaded."""
    found: set[tuple[str, str]] = set()
    pushed: list[str | None] = []  # string values pushed, in order (None: a memo entry that is not a string)
    memo: dict[int, str | None] = {}
    last: str | None = None
    for op, arg, _ in pickletools.genops(data):
        name = op.name
        if name in ("GLOBAL", "INST"):
            module, _, attr = str(arg).partition(" ")
            found.add((module, attr))
            last = None
        elif name in _STRING_OPS:
            last = arg if isinstance(arg, str) else arg.decode("latin-1") if isinstance(arg, bytes) else None
            pushed.append(last)
        elif name == "MEMOIZE":
            memo[len(memo)] = last
        elif name in ("PUT", "BINPUT", "LONG_BINPUT"):
            memo[int(arg)] = last
        elif name in ("GET", "BINGET", "LONG_BINGET"):
            last = memo.get(int(arg))
            pushed.append(last)
        elif name == "STACK_GLOBAL":
            # The pickler pushes the module and the name just before (MEMOIZE pushes nothing).
            if len(pushed) >= 2 and pushed[-2] and pushed[-1] is not None:
                found.add((pushed[-2], pushed[-1]))
            last = None
        else:
            last = None
    return found


def needed_modules(data: bytes) -> set[str]:
    """Top-level modules outside the standard library a pickle needs, besides what the runner stands in for."""
    modules = {module.split(".")[0] for module, attr in referenced_globals(data) if (module, attr) != DELAYED_CLASS}
    return {m for m in modules if m and m not in sys.stdlib_module_names and m not in ("__main__", "builtins")}


@dataclass
class PythonProbe:
    """What one interpreter on one machine is known to import, so each module is asked about once."""

    found: set[str] = field(default_factory=set)

    def check(self, transport: Transport, python: str, modules: Iterable[str], *, what: str,
              sys_path: Sequence[str] = ()) -> None:
        """Raise a ConfigError naming what ``python`` on the transport's machine cannot import.

        ``sys_path``: the directories the runner puts first on ``sys.path`` (``--sys-path``). The check runs in
        a new empty directory, as the ranks start in their run directory: a module found only in the directory
        this process runs in is not found there either.
        """
        wanted = sorted({*ALWAYS, *modules} - self.found)
        if not wanted:
            return
        # quote_path: $HOME/venv/bin/python is the login node's home, as the batch script has it.
        script = (f'd=$(mktemp -d) && cd "$d" || exit 1; {quote_path(python)} "$@"; s=$?; cd / && rmdir "$d"; '
                  'exit "$s"')
        argv = ["sh", "-c", script, "sh", *probe_argv(wanted, sys_path)]
        done = transport.run(argv, timeout=PROBE_TIMEOUT_S, check=False)
        try:
            answer = parse_answer(done.stdout) or {}
            version, missing = tuple(answer["version"]), list(answer["missing"])
        except (ValueError, KeyError, TypeError):
            detail = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise ConfigError(f"{python} on {transport.host} cannot run the check of {what}: {detail}", key="python",
                              hint="set the executor parameter python to the interpreter jobs should use") from None
        ours = tuple(sys.version_info[:2])
        if version != ours:
            raise ConfigError(
                f"{python} on {transport.host} is Python {version[0]}.{version[1]}, this one is "
                f"{ours[0]}.{ours[1]}: cloudpickle's pickles of functions load only in the same version",
                key="python", hint=f"point the executor parameter python at a Python {ours[0]}.{ours[1]} there")
        if missing:
            names = sorted({m.split(".")[0] for m in missing})
            found_here = [note for n in names if n not in _INSTALL and (note := found_here_note(n, sys_path))]
            fixes = [_INSTALL.get(n, f"install {n} in that Python (pip install, or pip install -e for your own "
                                     f"code), or pickle it by value: cloudpickle.register_pickle_by_value({n}) "
                                     "before submitting") for n in names]
            if sys_path and any(n not in _INSTALL for n in names):
                fixes.append(f"or move it into {', '.join(sys_path)}")
            raise ConfigError(f"{python} on {transport.host} cannot import {', '.join(missing)}, which {what} needs "
                              f"(the job starts in its run directory; {_path_words(sys_path)})"
                              + "".join(f"; {note}" for note in found_here),
                              key="python", hint="; ".join(fixes))
        self.found.update(wanted)


def _path_words(sys_path: Sequence[str]) -> str:
    """The job's sys.path in words."""
    rest = "the run directory and that Python's installed packages"
    return f"its sys.path: {', '.join(sys_path)}, then {rest}" if sys_path else f"its sys.path: {rest}"


def found_here_note(name: str, sys_path: Sequence[str]) -> str | None:
    """Where this process finds module ``name`` (and whether through its current directory), for the error."""
    found = import_location(name)  # a package's directory or a module's file ("built-in" for some)
    if found is None or not os.path.isabs(found):
        return None
    location = Path(found).resolve()
    here = Path.cwd().resolve()
    if location.parent == here and str(here) not in sys_path:
        return (f"this Python finds {name} at {location} through the directory you submit from ({here}), "
                "which the job does not run in")
    return f"this Python finds {name} at {location}"
