"""The one exception family raised for users of hpctrain.

Every error carries enough context (file, line, key, rank) to say what is wrong and how to fix it; the
CLI prints ``str(error)`` on one line and exits with ``error.exit_code``, never a traceback.
"""

from __future__ import annotations

from hpctrain import exit_codes
from hpctrain.text import MAX_ERRORS_SHOWN, printable


class HpctrainError(Exception):
    """Base of every error meant for a user. ``exit_code`` is what the CLI exits with."""

    exit_code = exit_codes.EXIT_ERROR

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        self.message = message
        self.hint = hint
        super().__init__(self.__str__())

    def __str__(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message


class ConfigError(HpctrainError):
    """A site profile or job spec is invalid: names the file, line and key."""

    exit_code = exit_codes.EXIT_CONFIG

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        line: int | None = None,
        key: str | None = None,
        hint: str | None = None,
    ) -> None:
        self.path = path
        self.line = line
        self.key = key
        super().__init__(message, hint=hint)

    def __str__(self) -> str:
        where = ""
        if self.path:
            where = printable(self.path) + (f":{self.line}" if self.line else "") + ": "
        key = f"{printable(self.key)}: " if self.key else ""
        tail = f"; {printable(self.hint)}" if self.hint else ""
        return f"{where}{key}{printable(self.message)}{tail}"


class ConfigErrors(ConfigError):
    """Several configuration errors found in one pass, reported together."""

    def __init__(self, errors: list[ConfigError]) -> None:
        self.errors = errors
        first = errors[0]
        super().__init__(first.message, path=first.path, line=first.line, key=first.key, hint=first.hint)

    def __str__(self) -> str:
        """One line per error, at most MAX_ERRORS_SHOWN per file, then how many more that file holds."""
        lines: list[str] = []
        shown: dict[str | None, int] = {}
        for e in self.errors:
            shown[e.path] = shown.get(e.path, 0) + 1
            if shown[e.path] <= MAX_ERRORS_SHOWN:
                lines.append(ConfigError.__str__(e))
        for path, count in shown.items():
            if count > MAX_ERRORS_SHOWN:
                where = f"{printable(path)}: " if path else ""
                lines.append(f"{where}and {count - MAX_ERRORS_SHOWN} more errors")
        return "\n".join(lines)


class UnknownRun(HpctrainError):
    """A run id (or prefix) names no run, or several, in the registry: a command-line value to correct."""

    exit_code = exit_codes.EXIT_CONFIG


class FitError(ConfigError):
    """A job spec does not fit its site: names the limit that is exceeded."""


class SchedulerError(HpctrainError):
    """A scheduler command failed (sbatch refused a script, qstat unreachable, ...)."""

    exit_code = exit_codes.EXIT_SCHEDULER


class TransportError(HpctrainError):
    """Running a command on a remote login node failed (unreachable, authentication, disk full)."""

    exit_code = exit_codes.EXIT_TRANSPORT


class RuntimeFailure(HpctrainError):
    """The training runtime failed: a dead or stuck rank, a collective timeout, a bad dataset."""

    exit_code = exit_codes.EXIT_RUNTIME


class DataError(HpctrainError):
    """A dataset is missing, malformed or of the wrong type."""

    exit_code = exit_codes.EXIT_CONFIG


class CheckpointError(HpctrainError):
    """No valid checkpoint could be read, or one could not be written."""

    exit_code = exit_codes.EXIT_CHECKPOINT
