"""Before a callable waits in a queue: can the job's Python load it?

The pickle of a submission names the modules it needs (a callable from an installed package is pickled by
reference; one from ``__main__`` by value, which needs cloudpickle). One command on the login node asks the
job's interpreter whether it finds each of them, the runner and cloudpickle, and which Python version it is;
what is missing becomes one error naming the interpreter, the machine, the module and how to install it.
"""

from __future__ import annotations

import json
import pickletools
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field

from hpctrain.errors import ConfigError
from hpctrain.submission.shell import is_home_relative, quote_path
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
# find_spec without importing anything but the parents of the dotted names asked for.
_PROBE = """import importlib.util, json, sys
missing = []
for name in sys.argv[1:]:
    try:
        found = importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        missing.append(name)
print(json.dumps({"version": list(sys.version_info[:2]), "missing": missing}))
"""
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

    def check(self, transport: Transport, python: str, modules: Iterable[str], *, what: str) -> None:
        """Raise a ConfigError naming what ``python`` on the transport's machine cannot import."""
        wanted = sorted({*ALWAYS, *modules} - self.found)
        if not wanted:
            return
        argv = [python, "-c", _PROBE, *wanted]
        if is_home_relative(python):  # $HOME/venv/bin/python: the login node's home, as the batch script has it
            argv = ["sh", "-c", f'exec {quote_path(python)} "$@"', "sh", *argv[1:]]
        done = transport.run(argv, timeout=PROBE_TIMEOUT_S, check=False)
        lines = done.stdout.strip().splitlines()
        try:
            answer = json.loads(lines[-1])
            version, missing = tuple(answer["version"]), list(answer["missing"])
        except (IndexError, ValueError, KeyError, TypeError):
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
            names = [m.split(".")[0] for m in missing]
            fixes = sorted({_INSTALL.get(n, f"install {n} there, or pickle your module by value with "
                                            f"cloudpickle.register_pickle_by_value({n})") for n in names})
            raise ConfigError(f"{python} on {transport.host} cannot import {', '.join(missing)}, which {what} needs",
                              key="python", hint="; ".join(fixes))
        self.found.update(wanted)
