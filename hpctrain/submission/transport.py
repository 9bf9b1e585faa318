"""Run scheduler commands and copy files on a login node: here (subprocess) or over one SSH ControlMaster.

Commands are argv lists end to end; over SSH they become ONE string built with ``shlex.join`` (ssh joins its
arguments with spaces, so every element is quoted). Failures become one ``TransportError`` each, in words.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Protocol, runtime_checkable

from hpctrain.errors import TransportError
from hpctrain.files import atomic_path

# Unix socket paths are limited to ~104-108 bytes; %C expands to 40 hex characters.
_MAX_SOCKET_PATH = 100


@dataclass(frozen=True)
class Completed:
    """What a command returned: exit status and its decoded output."""

    returncode: int
    stdout: str
    stderr: str


class CommandFailed(TransportError):
    """The command ran but exited non-zero (raised only with ``check=True``); ``completed`` has its output."""

    def __init__(self, message: str, completed: Completed) -> None:
        self.completed = completed
        super().__init__(message)


@runtime_checkable
class Transport(Protocol):
    """Where scheduler commands run. ``host`` describes it in messages ("this machine", "alice@login1")."""

    host: str

    def run(self, argv: list[str], *, timeout: float, input: bytes | None = None,
            check: bool = True) -> Completed: ...

    def put(self, local_path: str | os.PathLike[str], remote_path: str) -> None: ...

    def get(self, remote_path: str, local_path: str | os.PathLike[str]) -> None: ...

    def mkdir_p(self, path: str) -> None: ...


# A script is sent on standard input, not in argv: Linux caps one argument at 128 KiB (MAX_ARG_STRLEN), and over
# ssh the whole remote command is one argument, so a poll of a few hundred runs would not fit on a command line.
_READ_SCRIPT = 'eval "$(cat)"'


def run_script(transport: Transport, script: str, args: Sequence[str] = (), *, timeout: float,
               check: bool = False) -> Completed:
    """Run the POSIX sh ``script`` with positional parameters ``args`` on ``transport``; both travel on the
    command's standard input, so neither has a size limit (the script's own commands read an empty stdin)."""
    body = f"set -- {shlex.join(args)}\n{script}" if args else script
    return transport.run(["sh", "-c", _READ_SCRIPT], input=body.encode(), timeout=timeout, check=check)


def _decode(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else ""



def _scheduler_of(program: str) -> str | None:
    """Which schedulers ship ``program`` ("Cobalt or PBS"), by the back-ends' ``commands``; None: no scheduler's."""
    from hpctrain.config.backends import SCHEDULERS

    titles = sorted({backend.title for name in SCHEDULERS.names()
                     if program in getattr(backend := SCHEDULERS.load(name), "commands", ())})
    return " or ".join(titles) or None

def _missing_program_message(prog: str, where: str) -> str:
    scheduler = _scheduler_of(os.path.basename(prog))
    if scheduler:
        return (f"{prog} not found on {where}: load the {scheduler} module in the site profile's environment "
                f"or check that --remote names a login node of this site")
    return f"{prog} not found on {where}"


# "sh: 1: sbatch: not found", "bash: line 1: sbatch: command not found", "env: 'sbatch': No such file...",
# zsh's "zsh: command not found: sbatch"
_NOT_FOUND_ZSH = re.compile(r"command not found: (\S+)", re.I)
# GNU tools quote names with ‘’ in UTF-8 locales and with '' in the C locale.
_NOT_FOUND = re.compile(r"(?:^|: )['‘]?([^\s:'‘’]+)['’]?: (?:command )?not found|"
                        r"^env: ['‘]?([^\s:'‘’]+)['’]?: No such file or directory", re.M | re.I)


def _missing_name(stderr: str) -> str | None:
    """The program a shell could not find, read from its stderr (the command may be wrapped in sh -c)."""
    m = _NOT_FOUND_ZSH.search(stderr)
    if m:
        return m.group(1)
    m = _NOT_FOUND.search(stderr)
    return (m.group(1) or m.group(2)) if m else None


def _check_result(argv: list[str], completed: Completed, host: str, check: bool) -> Completed:
    if re.search(r"No space left on device|Disk quota exceeded", completed.stderr):
        raise TransportError(
            f"no space left on {host} while running {argv[0]}: {_last_line(completed.stderr)}",
            hint="free space or quota there, or point run_dir at another file system",
        )
    if completed.returncode == 127 or (completed.returncode != 0 and
                                       re.search(r"command not found", completed.stderr)):
        raise TransportError(_missing_program_message(_missing_name(completed.stderr) or argv[0], host))
    if check and completed.returncode != 0:
        detail = _last_line(completed.stderr) or _last_line(completed.stdout)
        raise CommandFailed(f"{shlex.join(argv)[:200]} on {host} exited {completed.returncode}: {detail}",
                            completed)
    return completed


class LocalTransport:
    """Runs commands on this machine (we are on the login node)."""

    host = "this machine"

    def run(self, argv: list[str], *, timeout: float, input: bytes | None = None,
            check: bool = True) -> Completed:
        """Run ``argv`` (no shell) with a timeout; non-zero exit raises CommandFailed when ``check``."""
        try:
            proc = subprocess.run(argv, input=input, capture_output=True, timeout=timeout,
                                  stdin=None if input is not None else subprocess.DEVNULL)
        except FileNotFoundError:
            raise TransportError(f"{argv[0]} not found on this machine; is this a login node?",
                                 hint="run hpctrain where the scheduler commands exist, or submit from here "
                                      "over ssh with --remote USER@LOGIN_NODE") from None
        except subprocess.TimeoutExpired:
            raise TransportError(f"{argv[0]} did not answer within {timeout:g} s on this machine") from None
        completed = Completed(proc.returncode, _decode(proc.stdout), _decode(proc.stderr))
        return _check_result(argv, completed, self.host, check)

    def put(self, local_path: str | os.PathLike[str], remote_path: str) -> None:
        """Copy a file (atomically: write beside, then rename)."""
        dest = Path(remote_path)
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            with atomic_path(dest) as tmp:
                shutil.copyfile(local_path, tmp)
        except OSError as exc:
            raise TransportError(f"cannot write {remote_path} on this machine: {exc.strerror}") from None

    def get(self, remote_path: str, local_path: str | os.PathLike[str]) -> None:
        """Copy a file back."""
        try:
            shutil.copyfile(remote_path, local_path)
        except OSError as exc:
            raise TransportError(f"cannot read {remote_path} on this machine: {exc.strerror}") from None

    def mkdir_p(self, path: str) -> None:
        """``mkdir -p``."""
        Path(path).mkdir(parents=True, exist_ok=True)

    def close(self) -> None:
        """Nothing to close (same interface as SSHTransport)."""


# ssh's own failures (exit 255) by their stderr, first match wins.
_SSH_ERRORS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"Could not resolve hostname|Name or service not known|Temporary failure in name "
                r"resolution|nodename nor servname"), "name"),
    (re.compile(r"Permission denied|Too many authentication failures|no matching host key|"
                r"Host key verification failed|Authentication failed"), "auth"),
    (re.compile(r"Connection refused|Connection timed out|No route to host|Network is unreachable|"
                r"Operation timed out|Connection reset|Connection closed by|kex_exchange_identification|"
                r"connect to host|Broken pipe"), "unreachable"),
]


def classify_ssh_failure(destination: str, returncode: int, stderr: str,
                         ssh_config: str | None = None) -> TransportError | None:
    """The TransportError for an ssh-level failure (exit 255 plus stderr), or None when it is not one.

    ``ssh_config`` is the file given with ``--ssh-config`` (None: ssh read the user's own config).
    """
    if returncode != 255:
        return None
    detail = _last_line(stderr)
    host = destination.rpartition("@")[2]
    for pattern, kind in _SSH_ERRORS:
        if pattern.search(stderr):
            if kind == "name":
                if ssh_config is None:
                    hint = (f"{host!r} (from --remote) is neither a host name this machine resolves nor a Host "
                            "alias in your ~/.ssh/config: check its spelling, or pass --ssh-config FILE when "
                            "the alias is defined in another file")
                else:
                    hint = f"check the spelling given to --remote and that {ssh_config} has `Host {host}`"
                return TransportError(f"cannot reach {destination}: host unreachable, its name does not "
                                      f"resolve ({detail})", hint=hint)
            if kind == "auth":
                return TransportError(f"authentication to {destination} failed ({detail})",
                                      hint=f"load your key (ssh-add) and check that `ssh {destination} true` "
                                           f"works without a password")
            return TransportError(f"cannot reach {destination}: host unreachable ({detail})",
                                  hint="check the host given to --remote, the network or VPN, and that the "
                                       "host is up")
    return None


def default_control_dir() -> str:
    """``~/.cache/hpctrain/ssh`` unless that path is too long for a unix socket, then a short /tmp path."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    path = os.path.join(base, "hpctrain", "ssh")
    if len(path) + 1 + 40 > _MAX_SOCKET_PATH:
        path = os.path.join(tempfile.gettempdir(), f"hpctrain-ssh-{os.getuid()}")
    return path


class SSHTransport:
    """Runs commands on a login node through the system OpenSSH client, one ControlMaster per host.

    The first command opens the master; it persists ``control_persist`` seconds after the last use, so a
    status poll costs one round trip, not one login (and one two-factor prompt where sites have them).
    """

    def __init__(self, destination: str, ssh_config: str | None = None, control_dir: str | None = None,
                 connect_timeout: float = 10, extra_opts: tuple[str, ...] | list[str] = (),
                 control_persist: int = 600) -> None:
        if not destination or destination.startswith("-"):
            raise TransportError(f"invalid ssh destination {destination!r}", hint="use user@host or a "
                                 "Host alias from your ssh config")
        self.destination = destination
        self.host = destination
        self.ssh_config = ssh_config
        self.control_dir = control_dir or default_control_dir()
        if len(self.control_dir) + 1 + 40 > _MAX_SOCKET_PATH:
            raise TransportError(f"ssh control_dir {self.control_dir} is too long for a unix socket "
                                 f"(at most {_MAX_SOCKET_PATH - 41} characters)")
        self._opts: list[str] = []
        if ssh_config:
            self._opts += ["-F", ssh_config]
        self._opts += [
            "-o", "ControlMaster=auto",
            "-o", f"ControlPath={self.control_dir}/%C",
            "-o", f"ControlPersist={int(control_persist)}",
            "-o", f"ConnectTimeout={max(1, round(connect_timeout))}",
            "-o", "BatchMode=yes",  # never hang on a password prompt
            "-o", "ServerAliveInterval=30",
            *extra_opts,
        ]

    def ssh_argv(self, remote_command: str | None = None, *control: str) -> list[str]:
        """The full ssh argv for one remote command string (already quoted) or a control operation."""
        argv = ["ssh", *self._opts, *control, "--", self.destination]
        if remote_command is not None:
            argv.append(remote_command)
        return argv

    def _exec(self, argv: list[str], *, timeout: float, input: bytes | None,
              what: str, into: BinaryIO | None = None) -> tuple[int, bytes, str]:
        """Run ssh; (exit status, stdout, stderr). With ``into`` the output goes to that file instead (b"")."""
        Path(self.control_dir).mkdir(parents=True, exist_ok=True, mode=0o700)
        # Output goes to files, not pipes: a master that ssh forks off (ControlPersist) must not keep our
        # pipes open, whatever the OpenSSH version.
        with tempfile.TemporaryFile() as spool, tempfile.TemporaryFile() as err:
            out = spool if into is None else into
            try:
                proc = subprocess.run(argv, input=input, stdout=out, stderr=err, timeout=timeout,
                                      stdin=None if input is not None else subprocess.DEVNULL)
            except FileNotFoundError:
                raise TransportError("ssh not found on this machine",
                                     hint="install the OpenSSH client") from None
            except subprocess.TimeoutExpired:
                raise TransportError(f"{what} on {self.destination} did not answer within {timeout:g} s",
                                     hint="the login node may be overloaded or unreachable") from None
            spool.seek(0)
            err.seek(0)
            stdout, stderr = spool.read(), _decode(err.read())
        failure = classify_ssh_failure(self.destination, proc.returncode, stderr, self.ssh_config)
        if failure is not None:
            raise failure
        return proc.returncode, stdout, stderr

    def run(self, argv: list[str], *, timeout: float, input: bytes | None = None,
            check: bool = True) -> Completed:
        """Run ``argv`` on the login node; arguments arrive verbatim (each one shell-quoted)."""
        if not argv:
            raise ValueError("empty argv")
        rc, out, err = self._exec(self.ssh_argv(shlex.join(argv)), timeout=timeout, input=input, what=argv[0])
        return _check_result(argv, Completed(rc, _decode(out), err), self.destination, check)

    def put(self, local_path: str | os.PathLike[str], remote_path: str, *, timeout: float = 120) -> None:
        """Copy a local file to the login node through the master (``cat`` to a temp name, then ``mv``)."""
        data = Path(local_path).read_bytes()
        tmp = f"{remote_path}.hpctrain-tmp"
        script = f"cat > {shlex.quote(tmp)} && mv -f {shlex.quote(tmp)} {shlex.quote(remote_path)}"
        rc, _, err = self._exec(self.ssh_argv(shlex.join(["sh", "-c", script])), timeout=timeout, input=data,
                                what="copy")
        if rc != 0:
            self._exec(self.ssh_argv(shlex.join(["rm", "-f", tmp])), timeout=timeout, input=None, what="rm")
            _check_result(["cat"], Completed(rc, "", err), self.destination, check=False)
            raise TransportError(f"cannot write {remote_path} on {self.destination}: {_last_line(err)}")

    def get(self, remote_path: str, local_path: str | os.PathLike[str], *, timeout: float = 120) -> None:
        """Copy a regular file from the login node: ssh writes it straight to disk (it is never whole in memory),
        beside ``local_path``, renamed into place once complete."""
        script = ('[ -e "$1" ] || { echo "$1: no such file" >&2; exit 1; }; '
                  '[ -f "$1" ] || { echo "$1: not a regular file" >&2; exit 1; }; exec cat -- "$1"')
        command = shlex.join(["sh", "-c", script, "sh", remote_path])
        try:
            with atomic_path(local_path, durable=False) as tmp, open(tmp, "wb") as into:
                rc, _, err = self._exec(self.ssh_argv(command), timeout=timeout, input=None, what="copy", into=into)
                if rc != 0:
                    raise TransportError(f"cannot read {remote_path} on {self.destination}: {_last_line(err)}")
        except OSError as exc:
            raise TransportError(f"cannot write {local_path} on this machine: {exc.strerror}") from None

    def mkdir_p(self, path: str, *, timeout: float = 60) -> None:
        """``mkdir -p`` on the login node."""
        self.run(["mkdir", "-p", "--", path], timeout=timeout)

    def check_master(self, timeout: float = 10) -> bool:
        """True when a master connection for this destination is up (``ssh -O check``)."""
        try:
            rc, _, _ = self._exec(self.ssh_argv(None, "-O", "check"), timeout=timeout, input=None,
                                  what="ssh -O check")
        except TransportError:
            return False
        return rc == 0

    def close(self, timeout: float = 10) -> None:
        """Stop the master connection (``ssh -O exit``); nothing happens when none is up."""
        try:
            self._exec(self.ssh_argv(None, "-O", "exit"), timeout=timeout, input=None, what="ssh -O exit")
        except TransportError:
            pass


TransportFactory = Callable[[str | None, str | None], Transport]


def default_transport_factory(remote: str | None, ssh_config: str | None) -> Transport:
    """LocalTransport on the login node, else one SSHTransport (ControlMaster) for ``remote``."""
    if remote is None:
        return LocalTransport()
    return SSHTransport(remote, ssh_config=ssh_config)


@dataclass
class TransportPool:
    """One transport per (remote, ssh config) for the life of a command: every call reuses its master."""

    factory: TransportFactory = default_transport_factory
    _made: dict[tuple[str | None, str | None], Transport] = field(default_factory=dict)

    def get(self, remote: str | None, ssh_config: str | None = None) -> Transport:
        key = (remote, ssh_config)
        if key not in self._made:
            self._made[key] = self.factory(remote, ssh_config)
        return self._made[key]

    def close(self, stop_masters: bool = False) -> None:
        """Forget the transports; ``stop_masters`` also ends their ssh masters (else they persist)."""
        if stop_masters:
            for t in self._made.values():
                close = getattr(t, "close", None)
                if close is not None:
                    close()
        self._made.clear()
