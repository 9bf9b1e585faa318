"""Gather the planner's numbers: the job spec, the site profile's network figures, a run's measurements, and
named assumptions for the rest; ``--set`` overrides any of them. Each keeps the file, key or reason it came from.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hpctrain.config.job import JobSpec
from hpctrain.config.scheduler_rules import scheduler_rules
from hpctrain.config.site import SiteProfile, locate_site
from hpctrain.config.walltime import parse_walltime
from hpctrain.errors import ConfigError
from hpctrain.planning.measurements import Measurements
from hpctrain.planning.model import Workload, even_buckets
from hpctrain.planning.parameters import Param, Parameters, Value, apply_sets, check_value

# What hpctrain's runtime does, and costs that one node cannot show: each with the reason it is assumed.
ASSUMED: dict[str, tuple[Value, str]] = {
    "reduction_overlap": (True, "hpctrain reduces gradient buckets during backward (runtime/reducer.py)"),
    "fusion_cycle_s": (0.0, "hpctrain reduces fixed buckets as they fill (runtime/reducer.py), no fusion cycle"),
    "input_overlap": (False, "hpctrain's tasks read the next batch on the training thread"),
    "input_sharding": ("shard", "hpctrain's tasks read their own shard of the input stream"),
    "startup_staged": (False, "hpctrain's batch scripts start Python from the shared file system"),
    "multinode_overhead_s": (0.0, "not measurable on one node; fit it from a multi-node run and --set it"),
    "launch_overhead_s": (20e-6, "about 20 us of Python per collective, measured on the test machine "
                                 "(docs/runtime.md)"),
    "record_s": (0.0, "a sharded input's per-record cost is inside the measured input time"),
    "input_bytes": (0.0, "per-step reads do not contend on the shared file system"),
    "stream_bytes": (0.0, "no input stream is read at start-up beyond the measured one-node start-up"),
    "env_files": (33028.0, "files of the test machine's Python environment (.venv with the torch CPU stack)"),
    "env_bytes": (1.5e9, "size of the test machine's Python environment"),
    "control_allreduces": (1.0, "the stop vote: one all-reduce of 16 bytes after every step, the default "
                                "(checkpoint/session.py stop_requested; a job's checkpoint.stop_check_every sets it)"),
    "adacomp_ratio": (0.02, "AdaComp sends about 1/50 of the dense bytes (no AdaComp run measured)"),
    "overlap_window_s": (0.0, "no gradient bucket timing measured: no overlap window"),
    "input_std_s": (0.0, "no input timing measured"),
    "input_s": (0.0, "no input timing measured"),
    "startup_s": (0.0, "no start-up measured"),
    "background_load": (0.0, "the job has its nodes to itself"),
    "allreduce_algorithm": ("auto", "each backend's own choice by message size (collectives.py)"),
    "hiccup_prob": (0.0, "no heavy tail of per-step stalls measured"),
    "hiccup_s": (0.0, "no heavy tail of per-step stalls measured"),
    "slow_node_fraction": (0.0, "no slow nodes known on the site"),
    "slow_node_slowdown": (0.0, "no slow nodes known on the site"),
}
# Network figures a site profile may leave out, with the typical value used instead.
SITE_DEFAULTS: dict[str, tuple[float, str]] = {
    "latency_us": (2.0, "a typical HPC interconnect's MPI latency"),
    "nic_gbps": (12.5, "a 100 Gbit/s network interface"),
    "intra_latency_us": (1.0, "shared memory between ranks of one node"),
    "intra_bandwidth_gbps": (10.0, "shared memory between ranks of one node"),
    "reduce_gbps": (5.0, "one core summing float32 vectors from memory"),
    "shared_core_latency_us": (1000.0, "about one Linux scheduler time slice (EEVDF: 0.75 ms x (1 + log2 CPUs))"),
    "filesystem_gbps": (100.0, "a parallel file system of a mid-sized machine"),
    "metadata_ops_per_s": (50000.0, "a Lustre metadata server's file opens per second"),
    "taper_nodes": (0.0, "full injection bandwidth between any two nodes (no taper)"),
    "taper": (1.0, "full injection bandwidth between any two nodes (no taper)"),
}
# Node counts beyond any machine (the largest have ~10^4-10^5 nodes).
MAX_NODES = 10_000_000
# Buckets a layout may have: the reduction is costed bucket by bucket.
MAX_BUCKETS = 100_000
# Bytes a checkpoint writes per gradient byte when no size is given: weights plus Adam's two moments.
CHECKPOINT_PER_GRAD_BYTE = 3.0
# A rank sums half precision in software on CPUs: measured on the test machine, an fp16 all-reduce of 0.85 MB
# took 5.5 ms against 0.33 ms in float32 over MPI (docs/runtime.md).
HALF_GAMMA = {"nccl": (1.0, "GPUs sum fp16/bf16 natively"), "xccl": (1.0, "GPUs sum fp16/bf16 natively"),
              "mpi": (16.0, "fp16 all-reduce 16x slower than float32 on the test machine (docs/runtime.md)"),
              "gloo": (16.0, "CPU libraries sum fp16/bf16 in software (docs/runtime.md)")}
# Parameters that only a run can give; without a run they must come from --set.
MEASURED_ONLY = ("compute_s", "compute_std_s", "grad_bytes")


@dataclass(frozen=True)
class PlanInputs:
    """The workload plus what the report needs to say about the job."""

    workload: Workload
    job_name: str
    site_name: str
    sample_unit: str
    lr_scaling: str
    warmup_kind: str
    max_nodes: int | None
    notes: tuple[str, ...] = ()
    model: str = "ffn"


def _site_file(site: SiteProfile) -> str:
    """The profile's file, relative to the working directory when it lies below it."""
    try:
        path = locate_site(site.name).resolve()
    except ConfigError:
        return f"site {site.name}"
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _job_params(job: JobSpec, where: str, site: SiteProfile) -> list[Param]:
    res, train, comb = job.resources, job.train, job.train.combiner
    out = [
        Param("ranks_per_node", float(res.ranks_per_node), "job", f"{where}: resources.ranks_per_node"),
        Param("threads_per_rank", float(res.threads_per_rank), "job", f"{where}: resources.threads_per_rank"),
        Param("batch_per_rank", float(train.batch_per_rank), "job", f"{where}: train.batch_per_rank"),
        Param("bucket_mb", float(comb.bucket_mb), "job", f"{where}: train.combiner.bucket_mb"),
        Param("combiner", comb.name, "job", f"{where}: train.combiner.name"),
        Param("compression", comb.compression, "job", f"{where}: train.combiner.compression"),
        Param("dasgd_period", float(comb.period), "job", f"{where}: train.combiner.period"),
        Param("dasgd_delay", float(comb.delay), "job", f"{where}: train.combiner.delay"),
        Param("walltime_s", float(parse_walltime(res.walltime)), "job", f"{where}: resources.walltime"),
        Param("checkpoint_every_steps", float(job.checkpoint.every_steps), "job", f"{where}: checkpoint.every_steps"),
        Param("control_allreduces", 1.0 / job.checkpoint.stop_check_every, "job",
              f"{where}: checkpoint.stop_check_every (the stop vote: one all-reduce of 16 bytes every "
              f"{job.checkpoint.stop_check_every} step(s), checkpoint/session.py stop_requested)"),
    ]
    out.append(_staging_param(job, where, site))
    # check_value: a backend the planner has no cost model for is one readable error, not a traceback
    if train.comm_backend != "auto":
        out.append(Param("backend", check_value("backend", train.comm_backend), "job", f"{where}: train.comm_backend"))
    else:
        out.append(Param("backend", check_value("backend", site.comm_backend), "site",
                         f"{_site_file(site)}: comm_backend"))
    return out


def _staging_param(job: JobSpec, where: str, site: SiteProfile) -> Param:
    """Whether the ranks start from a staged environment (an archive unpacked on each node, or a container) or
    read the shared one: the job's ``staging.environment``, else the site's default."""
    if job.staging is not None:
        mode, source, detail = job.staging.environment, "job", f"{where}: staging.environment"
    else:
        mode, source, detail = site.staging.environment, "site", f"{_site_file(site)}: staging.environment"
    return Param("startup_staged", mode != "none", source, f"{detail} ({mode})")


def site_parameters(site: SiteProfile) -> list[Param]:
    """The network and node figures of ``site``, each a named default where the profile has none."""
    where = _site_file(site)
    node = site.node.resolved()
    assert isinstance(node.cores, int)
    auto = " (auto: this machine)" if site.node.cores == "auto" else ""
    out = [Param("node_threads", float(node.cores * node.threads_per_core), "site",
                 f"{where}: node.cores x node.threads_per_core{auto}")]
    if node.all_core_speed is None:
        out.append(Param("all_core_speed", 1.0, "assumed", "a busy node computes as fast per thread as an idle "
                         f"one ({where} has no node.all_core_speed)"))
    else:
        out.append(Param("all_core_speed", float(node.all_core_speed), "site", f"{where}: node.all_core_speed"))
    if node.rank_speed_spread is None:
        out.append(Param("rank_speed_spread", 0.0, "assumed",
                         f"every core and node runs at the same speed ({where} has no node.rank_speed_spread)"))
    else:
        out.append(Param("rank_speed_spread", float(node.rank_speed_spread), "site",
                         f"{where}: node.rank_speed_spread"))
    net = site.network
    out.append(Param("nics_per_node", float(net.nics_per_node if net else 1), "site" if net else "assumed",
                     f"{where}: network.nics_per_node" if net else "one network interface per node"))
    for name, (default, why) in SITE_DEFAULTS.items():
        value = getattr(net, name, None) if net is not None else None
        if value is None:
            out.append(Param(name, default, "assumed", f"{why} ({where} has no network.{name})"))
        else:
            guessed = " (an estimate: listed under guessed)" if f"network.{name}" in site.guessed else ""
            out.append(Param(name, float(value), "site", f"{where}: network.{name}{guessed}"))
    return out


def _measured_params(m: Measurements, node_threads: float) -> list[Param]:
    where = m.where
    out = [
        Param("compute_s", m.compute.mean + m.between_steps_s, "measured",
              f"{where}: compute_s mean of {m.compute.count} steps"
              + (f" + {m.between_steps_s * 1e3:.3g} ms between steps (loop_s - step_s - control_s)"
                 if m.between_steps_s > 0 else "")),
        Param("compute_std_s", m.compute.std, "measured", f"{where}: compute_s spread"),
        Param("input_s", m.input.mean, "measured", f"{where}: input_s mean"),
        Param("input_std_s", m.input.std, "measured", f"{where}: input_s spread"),
        Param("overlap_window_s", m.overlap_window_s, "measured", f"{where}: overlap_window_s"),
        Param("grad_bytes", m.grad_bytes, "measured", f"{where}: the model's gradient ({len(m.buckets)} buckets)"),
        Param("calibration_ranks_per_node", float(m.ranks_per_node), "measured", f"{where}: ranks_per_node"),
    ]
    if m.startup_s is not None:
        out.append(Param("startup_s", m.startup_s, "measured", f"{where}: startup_s"))
    if m.wire_ratio is not None:
        out.append(Param("adacomp_ratio", m.wire_ratio, "measured", f"{where}: wire_ratio"))
    background = _background(m, node_threads)
    if background is not None:
        out.append(background)
    return out


STARVED = 0.95  # a rank on a CPU less than this share of its step waited for one


def _background(m: Measurements, node_threads: float) -> Param | None:
    """Other work on the node the run measured on, in runnable threads. A rank that got only a share s of a CPU
    shared that node's C threads fairly with B others: s = C / (own + B). One that never waited shows only
    what the others used of the room it left: the node's busy CPUs over the timed steps less the run's own
    (/proc/stat); profiles without that figure fall back on the load average minus the run itself, which
    also counts whatever ran in the minute before. C is the measuring node's (the profile's ``node_threads``),
    not the target's ``node_threads``, which the prediction puts the load on; profiles that do not record it
    are taken to have measured on a node like the target's, and the text says so."""
    own = m.ranks_per_node * m.threads_per_rank
    measured = float(m.node_threads) if m.node_threads is not None else node_threads
    node = (f"its node's {measured:.0f} hardware threads" if m.node_threads is not None else
            f"its node's hardware threads (not in the profile: {measured:.0f}, the target's, assumed)")
    target = f"; the prediction puts this load on the target's nodes of {node_threads:.0f} hardware threads"
    share = m.cpu_share
    if share is not None and share < STARVED:
        load = max(0.0, measured / share - own)
        return Param("background_load", load, "measured",
                     f"{m.where}: its ranks were on a CPU {share:.0%} of each step: {node} were shared with "
                     f"{load:.2f} threads of other work{target}")
    if m.background_cpus is not None:
        return Param("background_load", min(m.background_cpus, max(0.0, measured - own)), "measured",
                     f"{m.where}: other work kept {m.background_cpus:.2f} of {node} busy during the timed steps "
                     f"(node_cpus){target}")
    if m.loadavg_1m is not None:
        return Param("background_load", max(0.0, min(m.loadavg_1m - own, measured - own)), "measured",
                     f"{m.where}: 1-minute load average {m.loadavg_1m:.2f} on {node}, minus its own {own} "
                     f"threads{target}")
    return None


def _checked(p: Param) -> Param:
    """``p`` if its value lies in the parameter's range; else one error naming where the value came from."""
    try:
        check_value(p.name, p.value)
    except ConfigError as exc:
        raise ConfigError(f"{p.detail}: {exc.message}", key=p.name, hint=exc.hint) from None
    return p


def gather_parameters(job: JobSpec, job_path: str, site: SiteProfile, measured: Measurements | None,
                      sets: list[str] | tuple[str, ...] = ()) -> Parameters:
    """The planner parameters for ``job`` on ``site`` that are known: measured, job, site, assumed, then ``--set``,
    each checked against its range; the measured-only ones may be missing (``build_parameters`` requires them)."""
    params: dict[str, Param] = {}

    def put(p: Param) -> None:
        params[p.name] = p

    for name, (value, why) in ASSUMED.items():
        put(Param(name, value, "assumed", why))
    for p in [*site_parameters(site), *_job_params(job, job_path, site)]:
        put(p)
    backend = str(params["backend"].value)
    put(Param("half_gamma_factor", HALF_GAMMA[backend][0], "assumed", HALF_GAMMA[backend][1]))
    put(Param("calibration_ranks_per_node", params["ranks_per_node"].value, "assumed",
              "no run measured: the job's own ranks per node"))
    if site.network is not None and site.network.nodes is not None:
        put(Param("site_nodes", float(site.network.nodes), "site", f"{_site_file(site)}: network.nodes"))
    if measured is not None:
        for p in _measured_params(measured, float(params["node_threads"].value)):
            put(p)
    for name, p in params.items():
        params[name] = _checked(p)
    return apply_sets(Parameters(params), list(sets))


def build_parameters(job: JobSpec, job_path: str, site: SiteProfile, measured: Measurements | None,
                     sets: list[str] | tuple[str, ...] = ()) -> Parameters:
    """Every planner parameter for ``job`` on ``site``: measured, job, site, assumed, then ``--set``."""
    result = gather_parameters(job, job_path, site, measured, sets)
    missing = [name for name in MEASURED_ONLY if name not in result]
    if missing:
        raise ConfigError(
            f"no measurement of {', '.join(missing)}: the planner needs this job's step time on one node",
            hint="give --from RUN (a run of this job), or --calibrate, or "
                 + " ".join(f"--set {n}=VALUE" for n in missing))
    if "checkpoint_bytes" not in result:
        grad = result.num("grad_bytes")
        result = result.updated(Param("checkpoint_bytes", min(CHECKPOINT_PER_GRAD_BYTE * grad, 1e15), "assumed",
                                      "3 x the gradient bytes: the weights and Adam's two moments"))
    return result


def workload_for(params: Parameters, measured: Measurements | None, sets: list[str] | tuple[str, ...] = ()) -> Workload:
    """The workload: the measured bucket layout, or an even layout over the overlap window when there is no
    measured one or ``--set`` changed the gradient size, bucket size or window."""
    relayout = {"grad_bytes", "bucket_mb", "overlap_window_s"}
    changed = {s.partition("=")[0].strip() for s in sets}
    if measured is not None and measured.buckets and not (changed & relayout):
        return Workload(params, measured.buckets)
    grad, bucket = params.num("grad_bytes"), params.num("bucket_mb") * 2**20
    if grad / bucket > MAX_BUCKETS:
        raise ConfigError(f"{grad:.4g} gradient bytes in buckets of {params.num('bucket_mb'):g} MB make "
                          f"{grad / bucket:.3g} buckets; the planner costs at most {MAX_BUCKETS}", key="bucket_mb",
                          hint=f"a bucket_mb of at least {grad / MAX_BUCKETS / 2**20:.3g}")
    layout = even_buckets(grad, bucket, params.num("overlap_window_s"))
    return Workload(params, layout)


def max_nodes(site: SiteProfile) -> int | None:
    """The machine's node count (network.nodes), else its largest queue, else unknown."""
    if site.network is not None and site.network.nodes is not None:
        return site.network.nodes
    if site.queues:
        return max(q.max_nodes for q in site.queues.values())
    if scheduler_rules(site.scheduler).runs_here:  # this machine
        return 1
    return None


def plan_inputs(job: JobSpec, job_path: str, site: SiteProfile, measured: Measurements | None,
                sets: list[str] | tuple[str, ...] = ()) -> PlanInputs:
    """Everything ``hpctrain plan`` needs to predict ``job`` on ``site``."""
    params = build_parameters(job, job_path, site, measured, sets)
    unit = measured.sample_unit if measured is not None else "samples"
    return PlanInputs(workload_for(params, measured, sets), job.name, site.name, unit, job.train.lr_scaling,
                      job.train.warmup.kind, max_nodes(site), tuple(site_notes(site, params)), job.model)


def site_notes(site: SiteProfile, params: Parameters) -> list[str]:
    """A warning for each network figure the plan assumes because the site profile does not give it."""
    assumed = [name for name in SITE_DEFAULTS if params[name].source == "assumed"]
    if site.network is None:
        return [f"site {site.name!r} has no network: section; the plan assumes "
                + ", ".join(f"{n}={params[n].text()}" for n in assumed)
                + " (add them to the profile, or --set them)"]
    wanted = [n for n in assumed if n not in ("taper_nodes", "taper", "shared_core_latency_us")]
    if wanted:
        return [f"site {site.name!r} gives no network.{', network.'.join(wanted)}; the plan assumes "
                + ", ".join(f"{n}={params[n].text()}" for n in wanted)]
    return []


def check_before_measuring(job: JobSpec, job_path: str, site: SiteProfile, nodes: list[int] | None,
                           sets: list[str] | tuple[str, ...] = ()) -> None:
    """Refuse now what a plan would refuse after its measurement: a ``--set`` name or value, a job or site figure
    out of range, a node count the machine does not have. ``--calibrate`` asks this before it submits its run, so
    a plan that cannot be made costs no queue wait and no allocation."""
    gather_parameters(job, job_path, site, None, sets)
    if nodes is not None:
        check_nodes(nodes, site.name, max_nodes(site))


def check_nodes(nodes: list[int], site_name: str, limit: int | None) -> None:
    """A node count the machine (of ``limit`` nodes, None: unknown) does not have is an error naming the limit."""
    bad = [n for n in nodes if n < 1]
    if bad:
        raise ConfigError(f"--nodes {bad[0]}: a node count must be at least 1", key="--nodes")
    if max(nodes) > MAX_NODES:
        raise ConfigError(f"--nodes {max(nodes)}: more nodes than any machine has", key="--nodes",
                          hint=f"plan for at most {MAX_NODES:,} nodes")
    if limit is not None and max(nodes) > limit:
        raise ConfigError(f"--nodes {max(nodes)}: site {site_name!r} has {limit} nodes",
                          key="--nodes", hint=f"plan for at most {limit} nodes")
