"""``HpctrainExecutor``: submitit's executor API on every hpctrain site, from this machine or a laptop over ssh.

Registered as the ``submitit`` entry point ``executor``, so ``submitit.AutoExecutor(folder, cluster="hpctrain",
hpctrain_site="polaris", hpctrain_remote="alice@polaris.alcf.anl.gov")`` finds it. A submission is pickled
as submitit pickles it, checked against the job's Python (probe.py), and goes through hpctrain's one
stage-and-submit path: the pickle is staged into the run directory and the job runs the torch-free runner
instead of ``hpctrain run``. ``map_array`` and ``batch()`` become one job array where the scheduler has arrays.
"""

from __future__ import annotations

import os
import pickle
import sys
import uuid
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from submitit.core import core, utils

from hpctrain.config.common import walltime_seconds
from hpctrain.config.origin import locate
from hpctrain.config.preflight import walltime_warnings
from hpctrain.errors import ConfigError
from hpctrain.submission.api import submit_runs
from hpctrain.submission.registry import RunRegistry
from hpctrain.submission.render import python_for
from hpctrain.submission.schedulers.base import get_scheduler, place
from hpctrain.submission.transport import TransportPool
from hpctrain.submitit_plugin.job import HpctrainJob
from hpctrain.submitit_plugin.params import (
    DEFAULT_NAME,
    PARAMETERS,
    IgnoredParameterWarning,
    ParameterError,
    build_job,
    check_values,
    default_name,
    ignored_slurm_parameters,
    in_parameter_words,
    load_site_value,
    text_in_parameter_words,
)
from hpctrain.submitit_plugin.probe import PythonProbe, needed_modules
from hpctrain.submitit_plugin.runner import MODULE, PAYLOAD_FILE
from hpctrain.user_frame import PACKAGE_DIR, stacklevel_outside

if TYPE_CHECKING:
    from hpctrain.config.job import JobSpec
    from hpctrain.config.site import SiteProfile


def describe(function: object) -> str:
    """``module.qualname`` of a callable (of its class for a callable object)."""
    target = getattr(function, "func", function)
    named = target if hasattr(target, "__qualname__") else type(target)
    return f"{getattr(named, '__module__', '?')}.{getattr(named, '__qualname__', repr(target))}"


def script_directory() -> str | None:
    """The directory of the script this process runs (``python script.py``), which Python put first on its
    ``sys.path``; None in a notebook, the interactive prompt, ``python -c`` or ``python -m``."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if not path or getattr(main, "__spec__", None) is not None:
        return None
    return str(Path(path).resolve().parent)


def warn_about_slurm_parameters() -> None:
    """Warn about the ``slurm_*`` arguments of the AutoExecutor call that leads here.

    AutoExecutor passes an executor only its own prefixed names and the shared ones, and drops the rest without
    a word: a Slurm user who moves to cluster="hpctrain" would lose their partition and time silently. The
    arguments are seen only in AutoExecutor's frame (its constructor's ``flexible_init``, its
    ``_internal_update_parameters``), read here; called otherwise, nothing is said.
    """
    from submitit.auto import auto

    codes = {auto.flexible_init.__code__, auto.AutoExecutor._internal_update_parameters.__code__}
    frame = sys._getframe(1)
    while frame is not None and frame.f_code not in codes:
        frame = frame.f_back
    given = frame.f_locals.get("kwargs") if frame is not None else None
    text = ignored_slurm_parameters(given) if isinstance(given, dict) else None
    if text:
        warnings.warn(text, IgnoredParameterWarning, stacklevel=users_stacklevel())


def unset_through_auto_executor(executor: HpctrainExecutor) -> set[str]:
    """The parameters the AutoExecutor call that leads here gave as None (``hpctrain_queue=None``).

    AutoExecutor drops None values ("handled as not set") before they reach the executor, so through it a parameter
    once set could never be unset. Its caller's arguments are seen in the frame of submitit's
    ``Executor.update_parameters`` for the AutoExecutor that wraps ``executor``; called otherwise, nothing is found.
    """
    code = core.Executor.update_parameters.__code__
    frame = sys._getframe(1)
    while frame is not None and not (frame.f_code is code
                                     and getattr(frame.f_locals.get("self"), "_executor", None) is executor):
        frame = frame.f_back
    given = frame.f_locals.get("kwargs") if frame is not None else None
    if not isinstance(given, dict):
        return set()
    prefix = f"{HpctrainExecutor.name()}_"
    names = {k[len(prefix):] if k.startswith(prefix) else k for k, v in given.items() if v is None}
    return names & set(PARAMETERS)


def users_stacklevel() -> int:
    """The ``stacklevel`` of a warning given by the caller that points at the user's line: the first frame
    outside submitit and hpctrain."""
    import submitit

    return stacklevel_outside((str(Path(str(submitit.__file__)).parent) + os.sep, PACKAGE_DIR), skip=2)


def pickled(delayed: utils.DelayedSubmission, index: int, count: int) -> bytes:
    """The submission as submitit pickles it; a callable or argument that cannot be pickled is one clear error."""
    import cloudpickle

    try:
        return cloudpickle.dumps(delayed, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        which = f" (submission {index + 1} of {count})" if count > 1 else ""
        raise ConfigError(f"cannot pickle {describe(delayed.function)} and its arguments{which}: "
                          f"{type(exc).__name__}: {exc}",
                          hint="a submitted callable and its arguments must pickle with cloudpickle: pass file "
                               "paths or plain data, not open files, locks, sockets, generators or live "
                               "connections") from None


class HpctrainExecutor(core.Executor):
    """submitit executor backed by hpctrain: site profiles, rendering, submission, batched polling, registry.

    Parameters (also through ``update_parameters`` and AutoExecutor's ``hpctrain_<name>=``): see
    ``hpctrain.submitit_plugin.params.PARAMETERS``. ``max_num_timeout`` is the requeue budget after checkpoints
    (the job spec's ``checkpoint.max_requeues``); ``registry`` a run registry file (default: hpctrain's);
    ``pool`` the transports to use (one ssh master per login node).
    """

    job_class = HpctrainJob

    def __init__(self, folder: str | Path, site: object = None, remote: str | None = None,
                 ssh_config: str | None = None, run_root: str | None = None, python: str | None = None, *,
                 registry: str | os.PathLike[str] | None = None, pool: TransportPool | None = None,
                 max_num_timeout: int = 3, max_pickle_size_gb: float = 1.0) -> None:
        super().__init__(folder)
        self.max_num_timeout = max_num_timeout
        self.max_pickle_size_gb = max_pickle_size_gb
        self.registry_path = None if registry is None else os.fspath(registry)
        self.pool = pool or TransportPool()
        self._probes: dict[tuple[str | None, str | None, str, tuple[str, ...]], PythonProbe] = {}
        given = {"site": site, "remote": remote, "ssh_config": ssh_config, "run_root": run_root, "python": python}
        self._internal_update_parameters(**{k: v for k, v in given.items() if v is not None})

    @classmethod
    def _valid_parameters(cls) -> set[str]:
        return set(PARAMETERS)

    @classmethod
    def _equivalence_dict(cls) -> core.EquivalenceDict:
        return {"name": "name", "timeout_min": "timeout_min", "mem_gb": "mem_gb", "nodes": "nodes",
                "cpus_per_task": "cpus_per_task", "gpus_per_node": "gpus_per_node",
                "tasks_per_node": "tasks_per_node"}

    @classmethod
    def affinity(cls) -> int:
        """Available, but chosen by AutoExecutor only when asked for by name (``cluster="hpctrain"``)."""
        return 0

    def _internal_update_parameters(self, **kwargs: Any) -> None:
        """Check the new values together with the current ones, then keep them.

        Names, types, the job spec they make and the site profile are checked here; whether the job fits the
        site (queue limits, node shape, a required account) when it is submitted, as parameters may come in
        any order. ``slurm_*`` parameters given to AutoExecutor are warned about: it drops them. A value None
        unsets the parameter (``queue=None``, AutoExecutor's ``hpctrain_queue=None``): its default applies again.
        """
        warn_about_slurm_parameters()
        check_values(kwargs)
        given = {k: v for k, v in kwargs.items() if v is not None}
        merged = {**self.parameters, **given}
        for newer, older in (("walltime", "timeout_min"), ("timeout_min", "walltime")):
            if newer in given and older not in given:
                merged.pop(older, None)
        # None unsets a parameter (its default applies again), given here or through AutoExecutor.
        for name in ({k for k, v in kwargs.items() if v is None} | unset_through_auto_executor(self)) - set(given):
            merged.pop(name, None)
        self._checked(merged, merged.get("name") or DEFAULT_NAME, fit=False)
        # In place: AutoExecutor shares this dict.
        self.parameters.clear()
        self.parameters.update(merged)

    def _checked(self, values: dict[str, Any], name: str, *, fit: bool = True) -> tuple[JobSpec, SiteProfile]:
        check_values(values)
        try:
            job = build_job(values, max_requeues=self.max_num_timeout, name=name)
        except ConfigError as exc:
            raise in_parameter_words(exc, values) from None
        site = load_site_value(values.get("site"))
        scheduler = get_scheduler(site.scheduler)
        if values.get("remote") is not None and not scheduler.submits_over_ssh:
            raise ParameterError(f"site {site.name!r} ({scheduler.name}) runs on this machine; it takes no remote",
                                 key="remote", hint="pick the profile of the remote machine's site")
        if fit:
            try:
                place(job, site)
            except ConfigError as exc:
                raise in_parameter_words(locate(exc, job.origin), values) from None
        return job, site

    def job_spec(self, function: object = None) -> tuple[JobSpec, SiteProfile]:
        """The job spec and site profile a submission of ``function`` gets with the parameters now; a FitError
        naming the parameter when the job does not fit the site."""
        values = dict(self.parameters)
        name = values.get("name") or (DEFAULT_NAME if function is None else default_name(function))
        return self._checked(values, name)

    def python(self, site: SiteProfile) -> str:
        """The interpreter that runs the callable in the job."""
        remote = self.parameters.get("remote")
        return self.parameters.get("python") or python_for(site, sys.executable if remote is None else None)

    def job_sys_path(self) -> list[str]:
        """What the runner puts first on the job's ``sys.path``: the submitting script's directory, as a submitit
        job started there has it — when the job runs on this machine's file system (not over ``remote``)."""
        directory = script_directory()
        return [directory] if directory is not None and self.parameters.get("remote") is None else []

    def _internal_process_submissions(self, delayed_submissions: list[utils.DelayedSubmission]
                                      ) -> list[core.Job[Any]]:
        values = dict(self.parameters)
        first = delayed_submissions[0].function
        job, site = self.job_spec(first)
        remote, ssh_config = values.get("remote"), values.get("ssh_config")
        python = self.python(site)
        folder = utils.JobPaths.get_first_id_independent_folder(self.folder)
        folder.mkdir(parents=True, exist_ok=True)
        staged: list[Path] = []
        try:
            modules: set[str] = set()
            count = len(delayed_submissions)
            for index, delayed in enumerate(delayed_submissions):
                delayed.set_timeout(walltime_seconds(job.resources.walltime) // 60, self.max_num_timeout)
                data = pickled(delayed, index, count)
                if index == 0 and count * len(data) > self.max_pickle_size_gb * 1024**3:
                    raise ConfigError(f"submitting about {count} x {len(data) / 1024**3:.2f} GB of pickled callables "
                                      f"and arguments, more than max_pickle_size_gb={self.max_pickle_size_gb}",
                                      hint="pass paths to the data instead, or raise executor.max_pickle_size_gb")
                path = folder / f".{uuid.uuid4().hex}.pkl"
                path.write_bytes(data)
                staged.append(path)
                modules |= needed_modules(data)
            transport = self.pool.get(remote, ssh_config)
            sys_path = self.job_sys_path()
            probe = self._probes.setdefault((remote, ssh_config, python, tuple(sys_path)), PythonProbe())
            probe.check(transport, python, modules, what=f"the callable {describe(first)}", sys_path=sys_path)
            return self._submit(job, site, python, staged, may_requeue=self.may_requeue(delayed_submissions))
        finally:
            for path in staged:
                path.unlink(missing_ok=True)

    def may_requeue(self, delayed_submissions: Sequence[utils.DelayedSubmission]) -> bool:
        """Whether a submission may be requeued at its checkpoint signal: its callable can be checkpointed and
        ``max_num_timeout`` allows a requeue. Any other callable runs on to its end or to the walltime."""
        from hpctrain.submitit_plugin.runner import checkpoint_of

        return self.max_num_timeout > 0 and any(checkpoint_of(d.function) is not None for d in delayed_submissions)

    def runner_command(self, job: JobSpec, python: str) -> list[str]:
        """What each task runs in the job (instead of ``hpctrain run``)."""
        command = [python, "-m", MODULE, "--max-requeues", str(job.checkpoint.max_requeues),
                   "--signal", job.checkpoint.signal]
        if self.parameters.get("stderr_to_stdout"):
            command.append("--stderr-to-stdout")
        for directory in self.job_sys_path():
            command += ["--sys-path", directory]
        return command

    def _submit(self, job: JobSpec, site: SiteProfile, python: str, staged: Sequence[Path], *,
                may_requeue: bool) -> list[core.Job[Any]]:
        values = self.parameters
        command = self.runner_command(job, python)
        # The walltime's warning is about the time each requeued run gets to make progress: nothing to say for a
        # callable that is never requeued (submitit's README example: 1 minute for a function of a few seconds).
        unmeant = set() if may_requeue else set(walltime_warnings(job))
        arrays = get_scheduler(site.scheduler).array_index_variable is not None
        batches = [list(range(len(staged)))] if arrays else [[i] for i in range(len(staged))]
        ranks = job.resources.nodes * job.resources.ranks_per_node
        jobs: list[core.Job[Any]] = []
        with RunRegistry(self.registry_path) as reg:
            for batch in batches:
                # The checks' warnings name job-spec keys: say them with the parameters' names.
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    done = submit_runs(job, site, remote=values.get("remote"), ssh_config=values.get("ssh_config"),
                                       run_root=values.get("run_root"), command=command, registry=reg,
                                       pool=self.pool, tasks=len(batch) if len(batch) > 1 else None,
                                       files=[[(staged[i], PAYLOAD_FILE)] for i in batch])
                for caught_warning in caught:
                    if str(caught_warning.message) in unmeant:
                        continue
                    warnings.warn(text_in_parameter_words(str(caught_warning.message), values),
                                  caught_warning.category, stacklevel=users_stacklevel())
                for i, run, job_id in zip(batch, done.runs, done.job_ids, strict=True):
                    assert job_id is not None
                    new: HpctrainJob[Any] = HpctrainJob(self.folder, job_id, tasks=range(ranks), run_id=run.run_id,
                                                        registry_path=str(reg.path), pool=self.pool,
                                                        signal=job.checkpoint.signal)
                    new.paths.move_temporary_file(staged[i], "submitted_pickle")
                    jobs.append(new)
        return jobs

