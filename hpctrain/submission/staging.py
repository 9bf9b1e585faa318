"""The staging step of a batch script: the environment archive, a container image and input files copied once per
node to node-local storage, checked for space first, before the launcher starts the ranks from those copies.

``plan_staging`` decides from the job and the site (config/staging.py) and ``staging_lines`` writes the shell;
render.py calls both. Each file is read once from the shared file system and fanned out to every node: by Slurm's
``sbcast``, or where the launcher has no such broadcast (``mpiexec --ppn 1``, ``aprun -N 1``) by stage_tree.py, one
process per node whose rank 0 reads the file and MPI_Bcast sends it on. Where the job's Python has no working
mpi4py, and for directories, every node copies from the shared path itself. The rest of the per-node work is
templates/stage_node.tmpl. Both are fixed texts the script carries, every path an argument. docs/scaling.md,
"Staging", says when to use which.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from hpctrain.config.catalog import find_schema
from hpctrain.config.job import JobSpec
from hpctrain.config.site import SiteProfile, SiteStaging
from hpctrain.config.staging import (
    DATA_MAP_ENV,
    ENV_DIR,
    NODE_LOCAL_ENV,
    NODE_LOCAL_VARIABLE,
    STAGED_PYTHON,
    archive_key,
    data_files,
    effective,
)
from hpctrain.errors import ConfigError, HpctrainError
from hpctrain.exit_codes import EXIT_RUNTIME
from hpctrain.nodes.select import TRAINING_NODES_FILE
from hpctrain.submission.launchers import LaunchPlan, get_launcher
from hpctrain.submission.shell import ShellWord, comment, quote, quote_path, word
from hpctrain.submission.stage_tree import NO_TREE

if TYPE_CHECKING:
    from hpctrain.submission.transport import Transport

TEMPLATES = Path(__file__).resolve().parent / "schedulers" / "templates"
STAGE_TREE = Path(__file__).resolve().parent / "stage_tree.py"
TREE_CHUNK_MB = 64  # stage_tree.py's buffer per node: the memory it takes, and the size of one MPI_Bcast
# GPU flags of each container runtime, by the node's GPU kind (apptainer's docs; podman-hpc's and shifter's at NERSC).
CONTAINER_GPU_FLAGS = {"apptainer": {"nvidia": ["--nv"], "amd": ["--rocm"]},
                       "podman-hpc": {"nvidia": ["--gpu"]}, "shifter": {"nvidia": ["--module=gpu"]}}
NODE_LOCAL = ShellWord((NODE_LOCAL_ENV,))
ARCHIVE_COPY = "env.tar"  # where sbcast puts the archive on each node, under $HPCTRAIN_NODE_LOCAL
IMAGE_COPY = "image.sif"


def node_local(rest: str = "") -> ShellWord:
    """``$HPCTRAIN_NODE_LOCAL/rest`` as a word of the script."""
    return NODE_LOCAL + (f"/{rest}" if rest else "")


@dataclass(frozen=True)
class StagingPlan:
    """What a job copies to its nodes and how its ranks start from the copies."""

    staging: SiteStaging
    shared_python: str  # the interpreter on the shared file system (the archive's source)
    archive_link: str | None = None  # CACHE/KEY.tar, the link `hpctrain submit` points at the packed environment
    image: str | None = None  # a container image copied to every node (apptainer)
    data: dict[str, str] = field(default_factory=dict)  # shared path -> name under $HPCTRAIN_NODE_LOCAL

    @property
    def copies(self) -> bool:
        """Whether anything goes to node-local storage (a container run from the gateway copies nothing)."""
        return self.staging.environment == "archive" or bool(self.data) or self.image is not None

    @property
    def python(self) -> str:
        """The ranks' interpreter: the node-local copy's, the one inside the container, or the shared one."""
        if self.staging.environment == "archive":
            return node_local(STAGED_PYTHON)
        if self.staging.environment == "container":
            assert self.staging.container is not None
            return self.staging.container.python
        return self.shared_python

    def launch_python(self) -> str:
        """The interpreter of hpctrain's own launch helpers (local launcher, GPU wrapper): never the container's."""
        return self.python if self.staging.environment == "archive" else self.shared_python

    def rank_command(self, command: list[str], job: JobSpec, site: SiteProfile) -> list[str]:
        """``command`` with the shared interpreter replaced by the ranks' (in a container: the runtime's argv, then
        the image's interpreter). Words other than the interpreter stay as they are."""
        replacement = [*self.container_argv(job, site), self.python]
        out: list[str] = []
        for w in command:
            out += replacement if w == self.shared_python else [w]
        return out

    def container_argv(self, job: JobSpec, site: SiteProfile) -> list[str]:
        container = self.staging.container
        if self.staging.environment != "container" or container is None:
            return []
        gpu = CONTAINER_GPU_FLAGS[container.runtime].get(site.node.gpu_kind, []) \
            if job.resources.gpus_per_rank > 0 else []
        binds = self.data or self.image
        if container.runtime == "apptainer":
            image = node_local(IMAGE_COPY) if self.image else str(container.image)
            return ["apptainer", "exec", *gpu, *(["--bind", node_local()] if binds else []), *container.options,
                    image]
        if container.runtime == "podman-hpc":
            here = ShellWord(("PWD",), ":", ("PWD",))
            # --env-host: the launcher's rank variables and the script's HPCTRAIN_* reach the ranks inside.
            return ["podman-hpc", "run", "--rm", "--mpi", "--env-host", *gpu, "--volume", here, "--workdir",
                    ShellWord(("PWD",)), *(["--volume", node_local() + ":" + node_local()] if binds else []),
                    *container.options, str(container.image)]
        return ["shifter", f"--image={container.image}", *gpu, *container.options]


def job_data_paths(job: JobSpec) -> dict[str, str] | None:
    """The files the job's model reads (its plug-in's ``data_paths``); None when the model declares no schema."""
    schema, _ = find_schema(job.model)
    if schema is None:
        return None
    args, data = schema.parse(job.model_args, job.data, job.origin)
    return schema.data_paths(args, data)


def plan_staging(job: JobSpec, site: SiteProfile, shared_python: str) -> StagingPlan | None:
    """The job's staging on this site (None when it copies nothing); a ConfigError names what is missing."""
    staging = effective(site.staging, job.staging)
    assert isinstance(staging, SiteStaging)
    paths = job_data_paths(job) if staging.data is not False else {}
    if paths is None:
        raise ConfigError(f"model {job.model} declares no schema, so hpctrain does not know which files it reads",
                          key="staging.data", hint="declare SCHEMA with data_paths (docs/architecture.md), or "
                          "remove staging.data")
    data = data_files(paths, staging.data)
    container = staging.container if staging.environment == "container" else None
    image = str(container.image) if container is not None and container.runtime == "apptainer" else None
    plan = StagingPlan(staging=staging, shared_python=shared_python, image=image, data=data,
                       archive_link=(f"{staging.archive_cache.rstrip('/')}/{archive_key(shared_python)}.tar"
                                     if staging.environment == "archive" else None))
    if staging.environment == "none" and not data:
        return None
    if plan.copies and not staging.node_local_dir:
        key = "staging.environment" if staging.environment != "none" else "staging.data"
        raise ConfigError(f"site {site.name!r} names no node-local directory to stage into", key=key,
                          hint="set staging.node_local_dir in the site profile (e.g. /tmp), or stage nothing")
    return plan


def staged_site(site: SiteProfile, plan: StagingPlan | None) -> SiteProfile:
    """``site`` with the scheduler options that give a job its node-local storage (Cobalt's attrs are joined)."""
    if plan is None or not plan.copies or not plan.staging.directives:
        return site
    merged = dict(site.directives)
    for key, value in plan.staging.directives.items():
        if key == "attrs" and isinstance(merged.get(key), str) and isinstance(value, str):
            merged[key] = f"{merged[key]}:{value}"
        else:
            merged[key] = value
    return site.model_copy(update={"directives": merged})


def _node_local_root(staging: SiteStaging, job_id_variable: str) -> ShellWord:
    """``NODE_LOCAL_DIR/hpctrain-$JOBID``, ``$USER``/``$TMPDIR`` left to each node to expand."""
    assert staging.node_local_dir is not None
    pieces: list[str | tuple[str, ...]] = []
    text, at = staging.node_local_dir.rstrip("/") or "/", 0
    for match in NODE_LOCAL_VARIABLE.finditer(text):  # the variables the profile's validation allowed, no others
        pieces += [text[at:match.start()], (match.group(1) or match.group(2),)]
        at = match.end()
    pieces += [text[at:], "/hpctrain-", (job_id_variable, "none")]
    return ShellWord(*pieces)


def one_per_node(site: SiteProfile, launcher: str, nodes: int, command: list[str], python: str,
                 host_file: str | None = None) -> list[str]:
    """``command`` once on every node of the job (on those of ``host_file`` where given), through the site's
    launcher."""
    plan = LaunchPlan(nodes=nodes, ranks_per_node=1, threads_per_rank=1, python=python,
                      extra_args=tuple(site.launcher_args), cpu_bind=None, host_file=host_file)
    return get_launcher(launcher)(command, plan)


def training_host_file(job: JobSpec) -> str | None:
    """The node check's file of training nodes, relative to the run directory the script runs in, where the job has
    spare nodes (steps start on those nodes only); None: every node of the allocation."""
    return f"./{TRAINING_NODES_FILE}" if job.resources.spare_nodes > 0 else None


def staging_lines(plan: StagingPlan, job: JobSpec, site: SiteProfile, launcher: str, job_id_variable: str,
                  exit_record: str) -> list[str]:
    """The script's staging section: runs after the environment is set up, before the launch."""
    staging = plan.staging
    broadcast = get_launcher(launcher).broadcast  # empty: stage_tree.py, run one process per node
    lines = ["# ---- hpctrain: staging to node-local storage (docs/scaling.md, Staging) ------------------------------"]
    if not plan.copies:
        assert staging.container is not None
        image = comment(str(staging.container.image))
        return [*lines, f"# The ranks run in {staging.container.runtime}'s image {image}, which the site's image",
                "# gateway serves to the nodes: nothing is copied."]
    lines += [*_preamble_lines(plan, job_id_variable, exit_record), *_size_lines(plan, broadcast)]
    nodes = job.resources.nodes

    def on_every_node(*steps: str, arrays: str = "") -> str:
        node_script = ["bash", "-c", ShellWord(("hpctrain_stage_node",)), "hpctrain-stage", *steps]
        argv = one_per_node(site, launcher, nodes, node_script, plan.shared_python, training_host_file(job))
        text = " ".join(word(w) for w in argv) + (f" {arrays}" if arrays else "")
        return f"{text} \\\n    || hpctrain_staging_failed \"staging failed (the node's message is above)\""

    check = ["check", node_local(), ShellWord(("hpctrain_need_kb",)), ShellWord(("PWD",))]
    lines.append(f'echo "hpctrain: staging to ${{{NODE_LOCAL_ENV}}} on {nodes} node{"s" if nodes != 1 else ""}"')
    if broadcast:
        lines += [on_every_node(*check), *_broadcast_lines(plan, broadcast, on_every_node)]
    else:
        lines += [on_every_node(*check), *_tree_lines(plan, site, launcher, nodes, job)]
        # The copies first: where the tree did not run, they include the archive that the unpack then reads.
        unpack = ["--", "unpack", node_local(), node_local(ARCHIVE_COPY)] if plan.archive_link else []
        step = on_every_node(arrays=" ".join(['"${hpctrain_copies[@]}"', *(word(w) for w in unpack)]))
        lines.append(step if unpack else f'[ "${{#hpctrain_copies[@]}}" -eq 0 ] || {step}')
    if plan.data:
        lines.append(f"export {DATA_MAP_ENV}={quote(_json(plan.data))}")
    if staging.environment == "archive":
        lines += [f"export VIRTUAL_ENV={word(node_local(ENV_DIR + '/venv'))}",
                  'export PATH="${VIRTUAL_ENV}/bin:${PATH}"',
                  f'export LD_LIBRARY_PATH="${{{NODE_LOCAL_ENV}}}/{ENV_DIR}/libpython'
                  '${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}"',
                  "export PYTHONNOUSERSITE=1"]
    lines.append('echo "hpctrain: staged on every node in $((SECONDS - hpctrain_staging_start)) s"')
    return lines


def _preamble_lines(plan: StagingPlan, job_id_variable: str, exit_record: str) -> list[str]:
    """What is copied (comments), the node-local directory and the function that ends the job when staging fails."""
    staging = plan.staging
    what = [w for w, on in (("the Python environment (packed by `hpctrain submit`)", staging.environment == "archive"),
                            ("the container image", plan.image is not None),
                            (f"{len(plan.data)} input file{'s' if len(plan.data) != 1 else ''}", bool(plan.data)))
            if on]
    lines = [f"# Copied once per node before the ranks start: {', '.join(what)}.",
             "# The ranks then read them there instead of from the shared file system."]
    if staging.node_local_ram:
        lines.append("# The node-local directory is RAM-backed: what is staged there counts against the node's memory.")
    return [*lines,
            f"export {NODE_LOCAL_ENV}={word(_node_local_root(staging, job_id_variable))}",
            "hpctrain_staging_start=${SECONDS}",
            "hpctrain_staging_failed() {",
            f"    status={EXIT_RUNTIME}",
            '    echo "hpctrain: $1; the job ends before its ranks start" >&2',
            # The run's failure note, unless a node wrote its own first (set -e: the link may fail).
            "    { printf '%s\\n' \"$1\" > .failure.txt.staging && ln .failure.txt.staging failure.txt; } "
            "2>/dev/null || true",
            "    rm -f .failure.txt.staging",
            f"    {exit_record}",
            '    exit "${status}"',
            "}"]


def _size_lines(plan: StagingPlan, broadcast: tuple[str, ...]) -> list[str]:
    """The space the copies need on a node, read in this shell, and the per-node script (stage_node.tmpl)."""
    # Sizes: the archive (twice: it is copied before it is unpacked) and the input files.
    lines: list[str] = []
    sizes: list[str] = []
    if plan.archive_link:
        lines += [f"hpctrain_archive_link={quote_path(plan.archive_link)}",
                  'hpctrain_archive=$(readlink -f -- "${hpctrain_archive_link}") && [ -f "${hpctrain_archive}" ] \\',
                  '    || hpctrain_staging_failed "no packed environment at ${hpctrain_archive_link} (hpctrain submit '
                  'packs it: python -m hpctrain.submission.envpack)"']
        sizes += ['"${hpctrain_archive}"'] * 2
    if plan.image:
        lines.append(f"hpctrain_image={quote_path(plan.image)}")
        sizes += ['"${hpctrain_image}"'] * (2 if broadcast else 1)
    sizes += [quote(src) for src in plan.data]
    # -l counts a file named twice twice: the archive is on the node once as sent and once unpacked.
    return [*lines,
            f"hpctrain_need_kb=$(du -sklL --apparent-size -- {' '.join(sizes)} \\",
            "    | awk '{kb += $1} END {print kb + 1024}') \\",
            '    || hpctrain_staging_failed "cannot read the size of a file to stage (du says which above)"',
            "hpctrain_stage_node=$(cat <<'HPCTRAIN_STAGE_NODE'",
            *(TEMPLATES / "stage_node.tmpl").read_text(encoding="utf-8").rstrip("\n").splitlines(),
            "HPCTRAIN_STAGE_NODE",
            ")"]


def _broadcast_lines(plan: StagingPlan, broadcast: tuple[str, ...], on_every_node: Callable[..., str]) -> list[str]:
    """The copies through the launcher's broadcast (srun: sbcast), which reads each file once and fans it out; it
    cannot send a directory, which each node copies."""
    tool, name = " ".join(broadcast), broadcast[0]
    lines = ["hpctrain_copies=()"] if plan.data else []
    unpack: list[str] = []
    if plan.archive_link:
        lines.append(f'{tool} "${{hpctrain_archive}}" {word(node_local(ARCHIVE_COPY))} '
                     f'|| hpctrain_staging_failed "{name} of the environment failed"')
        unpack = ["unpack", node_local(), node_local(ARCHIVE_COPY)]
    if plan.image:
        lines.append(f'{tool} "${{hpctrain_image}}" {word(node_local(IMAGE_COPY))} '
                     f'|| hpctrain_staging_failed "{name} of the container image failed"')
    for src, dest in plan.data.items():
        lines += [f"if [ -f {quote(src)} ]; then",
                  f"    {tool} {quote(src)} {word(node_local(dest))} "
                  f'|| hpctrain_staging_failed "{name} of an input file failed"',
                  "else",
                  f"    hpctrain_copies+=(-- copy {quote(src)} {word(node_local(dest))})",
                  "fi"]
    if unpack or plan.data:
        lines.append(on_every_node(*unpack, arrays='"${hpctrain_copies[@]}"' if plan.data else ""))
    return lines


def _tree_lines(plan: StagingPlan, site: SiteProfile, launcher: str, nodes: int, job: JobSpec) -> list[str]:
    """The files sent by stage_tree.py (one read of each), and every node's own copy where it cannot run.

    ``hpctrain_tree`` holds the files, ``hpctrain_copies`` what each node copies itself (directories, and the files
    too when the job's Python has no mpi4py or MPI does not come up): both are steps of stage_node.tmpl's syntax.
    """
    python = plan.shared_python
    lines = ["hpctrain_tree=()", "hpctrain_copies=()"]
    if plan.archive_link:
        lines.append(f'hpctrain_tree+=(-- copy "${{hpctrain_archive}}" {word(node_local(ARCHIVE_COPY))})')
    if plan.image:
        lines.append(f'hpctrain_tree+=(-- copy "${{hpctrain_image}}" {word(node_local(IMAGE_COPY))})')
    for src, dest in plan.data.items():
        pair = f"-- copy {quote(src)} {word(node_local(dest))}"
        lines.append(f"if [ -f {quote(src)} ]; then hpctrain_tree+=({pair}); else hpctrain_copies+=({pair}); fi")
    lines += ["hpctrain_stage_tree=$(cat <<'HPCTRAIN_STAGE_TREE'",
              *STAGE_TREE.read_text(encoding="utf-8").rstrip("\n").splitlines(),
              "HPCTRAIN_STAGE_TREE",
              ")"]
    tree = [python, "-c", ShellWord(("hpctrain_stage_tree",)), str(nodes), ShellWord(("PWD",)), str(TREE_CHUNK_MB)]
    argv = one_per_node(site, launcher, nodes, tree, python, training_host_file(job))
    every_node = 'hpctrain_copies=("${hpctrain_tree[@]}" "${hpctrain_copies[@]}")'
    empty = "" if plan.archive_link or plan.image else '[ "${#hpctrain_tree[@]}" -eq 0 ] || '
    lines += [f"rm -f -- {NO_TREE}",
              f"{empty}if ! {word(python)} -c 'import mpi4py' 2>/dev/null; then",
              f'    echo "hpctrain: warning: the job\'s Python" {word(python)} "has no mpi4py: every node reads the '
              'shared copies itself (no broadcast)" >&2',
              f"    {every_node}",
              f'elif ! {" ".join(word(w) for w in argv)} "${{hpctrain_tree[@]}}"; then',
              f"    [ -f {NO_TREE} ] || hpctrain_staging_failed \"staging failed (the node's message is above)\"",
              f'    echo "hpctrain: warning: no broadcast ($(cat {NO_TREE})): every node reads the shared copies '
              'itself" >&2',
              f"    {every_node}",
              "fi"]
    return lines


def _json(data: dict[str, str]) -> str:
    return json.dumps(data, sort_keys=True)


# Packing a multi-GB environment on a busy login node file system can take minutes (reused afterwards).
PACK_TIMEOUT_S = 3600.0


def pack_environment(transport: Transport, job: JobSpec, site: SiteProfile, shared_python: str,
                     expand_home: Callable[[str], str]) -> str | None:
    """Pack (or reuse) the environment a job that stages ``archive`` starts from, on the machine its job script
    reads it on; returns what the packer said, None when the job stages no environment.

    Runs the job's own interpreter there (``-m hpctrain.submission.envpack``), so the archive holds exactly the
    environment the ranks would otherwise import from the shared file system.
    """
    staging = effective(site.staging, job.staging)
    if staging.environment != "archive":
        return None
    argv = [expand_home(shared_python), "-m", "hpctrain.submission.envpack", "--cache", staging.archive_cache,
            "--name", archive_key(shared_python)]
    done = transport.run(argv, timeout=PACK_TIMEOUT_S, check=False)
    if done.returncode != 0:
        last = next((ln for ln in reversed((done.stderr + "\n" + done.stdout).splitlines()) if ln.strip()), "")
        raise HpctrainError(f"packing the environment of {shared_python} on {transport.host} failed: "
                            f"{last.strip() or f'exit {done.returncode}'}",
                            hint="the job's Python needs hpctrain installed (its base install is enough); "
                            "or set staging.environment: none")
    return done.stdout.strip()
