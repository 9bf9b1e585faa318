"""Read a run's measured step profile for ``--from RUN``: a run directory on this machine, or a registered run
(local, on this login node, or on a remote login node over the run's ssh connection: one command).
"""

from __future__ import annotations

from pathlib import Path

from hpctrain.errors import ConfigError, DataError, HpctrainError
from hpctrain.files import read_regular_text
from hpctrain.planning.measurements import PROFILE_FILE, Measurements, parse_profile
from hpctrain.submission.registry import RunRegistry
from hpctrain.submission.run_record import read_meta
from hpctrain.submission.transport import TransportPool
from hpctrain.text import writable_text

_MISSING = "@@hpctrain-no-profile"
READ_TIMEOUT_S = 60.0


def _no_profile(where: str, state: str | None = None) -> DataError:
    shown = f" (run state: {state})" if state else ""
    return DataError(f"{where} has no step profile{shown}",
                     hint="it has not trained a step yet, or it ran with an hpctrain older than the planner: wait "
                          "for it, or measure with --calibrate")


def read_run_dir(run_dir: Path) -> Measurements:
    """The profile of a run directory on this machine."""
    path = run_dir / PROFILE_FILE
    try:
        text = read_regular_text(path)
    except FileNotFoundError:
        raise _no_profile(f"run directory {run_dir}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None
    return parse_profile(text, str(path))


def _is_dir(ref: str) -> bool:
    """Whether ``ref`` names a directory; a name the system cannot look up (too long, a NUL) is not one."""
    try:
        return Path(ref).is_dir()
    except (OSError, ValueError):
        return False


def read_run(ref: str, registry: RunRegistry | None = None, pool: TransportPool | None = None) -> Measurements:
    """The profile of ``ref``: a run directory, or a run id (or unique prefix) in the registry."""
    if _is_dir(ref):
        return read_run_dir(Path(ref))
    if not writable_text(ref):
        raise ConfigError(f"--from {ref!r}: holds bytes that are not UTF-8 text or a NUL: not a run id or a directory")
    own = registry is None
    registry = registry or RunRegistry()
    try:
        try:
            run = registry.get_run(ref)
        except HpctrainError as exc:
            raise ConfigError(f"--from {ref}: {exc.message}", hint=exc.hint) from None
        path = f"{run.run_dir}/{PROFILE_FILE}"
        where = f"run {run.run_id}"
        if run.remote is None:
            try:
                return parse_profile(read_regular_text(path), f"{where}: {path}")
            except FileNotFoundError:
                raise _no_profile(where, run.state) from None
            except (OSError, UnicodeDecodeError) as exc:
                raise DataError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None
        meta = read_meta(registry, run)
        transport = (pool or TransportPool()).get(run.remote, meta.ssh_config)
        script = f'cat -- "$1" 2>/dev/null || echo {_MISSING} >&2'
        done = transport.run(["sh", "-c", script, "sh", path], timeout=READ_TIMEOUT_S, check=False)
        if _MISSING in done.stderr:
            raise _no_profile(where, run.state)
        return parse_profile(done.stdout, f"{where}: {run.remote}:{path}")
    finally:
        if own:
            registry.close()
