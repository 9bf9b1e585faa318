"""The synchronous data-parallel training loop behind ``hpctrain run``.

One loop for every model: the task gives batches and a loss, the reducer hands fused gradient buckets to
the combiner strategy during backward (runtime/combiners/: the combiner also decides the optimizer step and
what runs around it), the LR schedule sets the rate, checkpoints are written at step boundaries, and a
walltime or preemption signal stops the run after a checkpoint so the job can be requeued.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from hpctrain.config.job import JobSpec
from hpctrain.config.preflight import steps_per_epoch
from hpctrain.errors import RuntimeFailure
from hpctrain.exit_codes import REQUEUE_MARKER
from hpctrain.files import write_atomic
from hpctrain.launch_env import detect_launch_env
from hpctrain.models.registry import build_task
from hpctrain.models.task import TaskContext, TrainingTask
from hpctrain.runtime import devices
from hpctrain.runtime.combiners import Combiner, build_combiner
from hpctrain.runtime.comm.backends import make_communicator
from hpctrain.runtime.comm.base import Communicator
from hpctrain.runtime.counting import counters, work_counts
from hpctrain.runtime.counting.rank_times import RANK_TIMES_FILE, RankTimes
from hpctrain.runtime.intel import maybe_optimize, wanted_from_env
from hpctrain.runtime.metric_sinks import MetricsSink, open_sinks
from hpctrain.runtime.metrics import MetricsLog, note_attempt
from hpctrain.runtime.node_stats import NodeStats
from hpctrain.runtime.optim import build_optimizer
from hpctrain.runtime.precision import Precision, forward_context, resolve_precision
from hpctrain.runtime.profile import StepProfiler, start_profile
from hpctrain.runtime.rank_list import node_summary
from hpctrain.runtime.reducer import Reducer, broadcast_model, check_sync
from hpctrain.runtime.schedule import LRSchedule

if TYPE_CHECKING:
    from hpctrain.checkpoint.session import CheckpointSession

log = logging.getLogger("hpctrain.train")



@dataclass
class TrainOutcome:
    """How a training run ended on this rank."""

    start_step: int
    end_step: int
    stopped_by_signal: bool = False
    final: dict[str, float] = field(default_factory=dict)
    parameters_checksum: float = 0.0


def choose_backend(requested: str, world_size_hint: int, environ: dict[str, str]) -> str:
    """``auto`` picks mpi under an MPI launcher when mpi4py is importable, else gloo; one rank needs none."""
    if requested != "auto":
        return requested
    env = detect_launch_env(environ)
    if env.size == 1 and world_size_hint <= 1:
        return "none"
    if env.launcher in ("torchrun", "env"):  # torchrun or hpctrain's local launcher: no MPI process manager
        return "gloo"
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return "gloo"
    return "mpi"


def pick_device(job: JobSpec, local_rank: int, backend: str = "none") -> torch.device:
    """The backend's device (nccl: cuda, also ROCm; xccl: xpu), a GPU the job asked for, else the CPU."""
    return devices.pick_device(job.resources.gpus_per_rank, backend, local_rank)


def parameters_checksum(model: torch.nn.Module) -> float:
    with torch.no_grad():
        return float(sum(p.double().sum() for p in model.parameters()))


def train(job: JobSpec, run_dir: Path, *, backend: str = "auto", check_sync_every: int = 0,
          environ: dict[str, str] | None = None) -> TrainOutcome:
    """Train ``job`` on the ranks the launcher started; rank 0 writes metrics and (with others) checkpoints."""
    environ = dict(os.environ if environ is None else environ)
    torch.set_num_threads(job.resources.threads_per_rank)
    env = detect_launch_env(environ)
    chosen = choose_backend(backend if backend != "auto" else job.train.comm_backend, env.size, environ)
    comm = make_communicator(chosen, job.train.collective_timeout_s, environ)
    if comm.size != env.size:
        comm.close()
        raise RuntimeFailure(
            f"the launcher ({env.launcher}) started {env.size} ranks but backend {chosen!r} sees {comm.size}",
            hint="with mpi, mpi4py must use the MPI of the launcher (srun --mpi=pmi2 with MPICH; see docs/runtime.md)")
    try:
        outcome = _train_with(job, run_dir, comm, env.local_rank, check_sync_every,
                              intel_extension=wanted_from_env(environ), environ=environ)
    except BaseException:
        # No closing collective after an error: the others may be inside another one, or gone, and the error
        # that reaches the user must be this one, not the closing barrier's "connection closed by peer".
        comm.abandon()
        raise
    comm.close()
    return outcome


def _train_with(job: JobSpec, run_dir: Path, comm: Communicator, local_rank: int,
                check_sync_every: int, intel_extension: bool = False,
                environ: Mapping[str, str] | None = None) -> TrainOutcome:
    from hpctrain.checkpoint.session import CheckpointSession

    rank, size = comm.rank, comm.size
    run_dir.mkdir(parents=True, exist_ok=True)
    device = pick_device(job, local_rank, comm.backend)
    precision = resolve_precision(job.train.precision, device)
    if rank == 0 and job.train.precision != "float32":
        log.info("precision %s: the forward runs in %s on %s", job.train.precision, precision, device)
    task, sinks = _prepare_task(job, run_dir, comm, local_rank, device, precision)
    nodes = NodeStats.start(comm, run_dir, job.resources, os.environ if environ is None else environ)
    model = task.model.to(device)
    broadcast_model(model, comm)
    schedule = LRSchedule.from_spec(job.schedule_config(), size, steps_per_epoch(job, size))
    optimizer = build_optimizer(model.parameters(), job.train.optimizer.model_dump(exclude_none=True),
                                lr=schedule.lr_at(0))
    model, optimizer, _ = maybe_optimize(model, optimizer, wanted=intel_extension, device=device,
                                         announce=rank == 0)
    task.model = model  # IPEX optimizes in place; keep the task's reference the one that is trained
    combiner = build_combiner(job.train.combiner, comm, [p for p in model.parameters() if p.requires_grad])
    reducer = Reducer(model, comm, combiner, bucket_mb=job.train.combiner.bucket_mb)
    session = CheckpointSession(job, run_dir, comm, task=task, model=model, optimizer=optimizer,
                                schedule=schedule, combiner=combiner, tally=work_counts.active())
    start = session.restore()
    if rank == 0:  # an earlier attempt's request; this attempt writes its own when it stops
        (run_dir / REQUEUE_MARKER).unlink(missing_ok=True)
        note_attempt(run_dir, start)
    metrics = MetricsLog(run_dir / "metrics.jsonl" if rank == 0 else None, job.train.steps, task.sample_unit,
                         sinks=sinks)
    # timings for `hpctrain plan`
    profiler = start_profile(job, run_dir, comm, model, reducer, combiner, task, precision)
    rank_times = RankTimes(profiler.stats, run_dir / RANK_TIMES_FILE if rank == 0 else None)
    loss_sum, loss_count, interval_start, interval_steps = 0.0, 0, time.perf_counter(), 0
    last_logged: dict[str, float] = {}  # the final record repeats them: a finished run's progress shows its loss
    step = start
    stopped = False
    counters.mark("startup")  # file-open counts up to the first step (free when counting is off)
    try:
        while step < job.train.steps:
            lr = schedule.lr_at(step)
            loss = _train_step(task, reducer, combiner, optimizer, lr, profiler, precision, device, rank, step)
            step += 1
            work_counts.step_done()  # per-rank counts per step (one test when counting is off)
            loss_sum, loss_count, interval_steps = loss_sum + float(loss.detach()), loss_count + 1, interval_steps + 1
            if step % job.train.log_every == 0 or step == job.train.steps:
                rate = interval_steps * task.samples_per_step / (time.perf_counter() - interval_start)
                link_slots = nodes.link_slots()  # the probe, beyond one node: after the rate, not in it
                record = _interval_record(comm, task, step, lr, loss_sum, loss_count, rate,
                                          combiner.interval_metrics(), rank_times.busy_s(), link_slots)
                if rank == 0:
                    _write_interval(record, interval_steps, nodes, metrics, rank_times)
                last_logged = {k: record[k] for k in ("loss", "per_rank_rate") if k in record}
                loss_sum, loss_count, interval_start, interval_steps = 0.0, 0, time.perf_counter(), 0
            if check_sync_every and step % check_sync_every == 0 and combiner.ranks_in_sync:
                differing = check_sync(model, comm)
                if differing:
                    names = ", ".join(differing[:5])
                    raise RuntimeFailure(f"parameters differ across ranks after step {step}: {names}")
            if _save_and_vote(session, combiner, profiler, step, job.train.steps):
                stopped = step < job.train.steps
                if stopped and rank == 0:  # before comm.close()'s barrier: no rank exits before it exists
                    _write_requeue_marker(run_dir, step)
                break
    finally:
        counters.mark("trained")  # the communicator's close comes after: its calls are counted apart
        profiler.write()
        metrics.close()
        session.close()
    combiner.flush()
    final = task.evaluate() if rank == 0 and not stopped else {}
    if final and rank == 0:
        metrics = MetricsLog(run_dir / "metrics.jsonl", job.train.steps, task.sample_unit,
                             sinks=open_sinks(job.metrics, run_dir, job.name))
        metrics.write({"step": step, "final": True, **last_logged, **final})
        metrics.close()
    return TrainOutcome(start_step=start, end_step=step, stopped_by_signal=stopped, final=final,
                        parameters_checksum=parameters_checksum(model))


def _write_interval(record: dict[str, Any], steps: int, nodes: NodeStats, metrics: MetricsLog,
                    rank_times: RankTimes) -> None:
    """Rank 0: the interval's record to the metrics (with the stragglers named in it) and its per-rank and per-node
    times to ``rank_times.jsonl``."""
    busy, node_link = record.pop("rank_busy_s"), record.pop("node_link_s")
    per_node = nodes.observe(record["step"], steps, busy, node_link)
    if "stragglers" in per_node:
        record["stragglers"] = per_node.pop("stragglers")
    metrics.write(record)
    rank_times.write(record["step"], busy, per_node)


def _prepare_task(job: JobSpec, run_dir: Path, comm: Communicator, local_rank: int, device: torch.device,
                  precision: Precision) -> tuple[TrainingTask, list[MetricsSink]]:
    """This rank's task (its data prepared) and, on rank 0, the metrics sinks; every rank learns whether every
    other rank's preparation went well before any training collective."""
    rank = comm.rank
    ctx = TaskContext(model_args=dict(job.model_args), data=dict(job.data), batch_per_rank=job.train.batch_per_rank,
                      seed=job.train.seed, rank=rank, world_size=comm.size, run_dir=run_dir, device=device,
                      barrier=lambda: comm.barrier("data preparation"), local_rank=local_rank, precision=precision,
                      agree=lambda error: comm.agree(error, "data preparation"))
    # Every rank reports how its data preparation went before any training collective: one rank's error (a
    # missing dataset, a file that is not HDF5) ends every rank with that error instead of a broken collective.
    error: Exception | None = None
    sinks: list[MetricsSink] = []
    try:
        task: TrainingTask = build_task(job.model, ctx)
        sinks = open_sinks(job.metrics, run_dir, job.name) if rank == 0 else []
    except Exception as exc:
        error = exc
    comm.agree(error, "data preparation")
    if local_rank == 0:  # every rank of the node recorded its pid before the agreement: one line per node
        summary = node_summary(run_dir, os.environ)
        if summary is not None:
            print(summary, file=sys.stderr, flush=True)
    return task, sinks


def _train_step(task: TrainingTask, reducer: Reducer, combiner: Combiner, optimizer: torch.optim.Optimizer,
                lr: float, profiler: StepProfiler, precision: Precision, device: torch.device, rank: int,
                step: int) -> torch.Tensor:
    """One step at learning rate ``lr``: input, forward, backward, the combined gradient, the optimizer step;
    returns this rank's loss."""
    profiler.begin()
    for group in optimizer.param_groups:
        group["lr"] = lr
    batch = task.next_batch()
    profiler.mark("input")
    reducer.zero_grad()
    with forward_context(precision, device):
        loss, aux = task.forward_loss(batch)
    if not torch.isfinite(loss):
        raise RuntimeFailure(f"rank {rank}: loss is {loss.item()} at step {step}",
                             hint="lower train.lr or check the data")
    scale = combiner.loss_scale  # the mean's 1/ranks: the reducer then only sums
    (loss * scale if scale != 1.0 else loss).backward()
    profiler.mark("backward")
    combiner.after_backward()
    profiler.mark("reduced")
    clip = getattr(task, "clip_gradients", None)
    if clip is not None:
        clip()
    combiner.optimizer_step(optimizer)
    combiner.after_step()
    task.observe(batch, aux)
    profiler.end()
    return loss


def _save_and_vote(session: CheckpointSession, combiner: Combiner, profiler: StepProfiler, step: int,
                   steps: int) -> bool:
    """After step ``step``: the checkpoint when one is due (and the last one), then the ranks' stop vote; a stop
    saves this step first when it is not saved yet. Returns whether to stop."""
    if step == steps:
        combiner.finish_training()  # before the final checkpoint, so it holds the model every rank has
    if session.due(step) or step == steps:
        with counters.span("save"):
            session.save(step)
    voting = time.perf_counter()
    stop = session.stop_requested(step)
    profiler.control(time.perf_counter() - voting)
    if stop and not session.saved_at(step):
        with counters.span("save"):
            session.save(step)
    return bool(stop)


def _write_requeue_marker(run_dir: Path, step: int) -> None:
    """Tell the batch script that this attempt stopped at checkpoint ``step`` to be requeued (exit_codes.py says
    why a launcher's status alone cannot); written whole or not at all."""
    marker = run_dir / REQUEUE_MARKER
    try:
        write_atomic(marker, json.dumps({"step": step, "time": time.time()}) + "\n")
    except OSError as exc:  # the checkpoint is committed; only a launcher that kills late ranks misses the requeue
        log.warning("could not write %s (%s): a launcher that ends the other ranks may report this stop as a "
                    "failure", marker, exc)


def _interval_record(comm: Communicator, task: TrainingTask, step: int, lr: float, loss_sum: float,
                     loss_count: int, rate: float, combiner_metrics: dict[str, float] | None = None,
                     busy_s: float = math.nan, node_slots: Sequence[float] = ()) -> dict[str, Any]:
    """Loss averaged over all ranks, task and combiner metrics averaged, rate the slowest rank's samples/s;
    ``rank_busy_s``: every rank's ``busy_s``, in rank order (one slot per rank in the same all-reduce);
    ``node_link_s``: the sums of every rank's ``node_slots`` (one slot per node, in the same all-reduce)."""
    local = {**task.interval_metrics(), **(combiner_metrics or {})}
    keys = sorted(local)
    slots = [0.0] * comm.size
    slots[comm.rank] = busy_s
    values = torch.tensor([loss_sum, float(loss_count), *[local[k] for k in keys], *slots, *node_slots],
                          dtype=torch.float64)
    comm.allreduce_(values, "sum", "metrics")
    slowest = torch.tensor([rate], dtype=torch.float64)
    comm.allreduce_(slowest, "min", "metrics rate")
    record: dict[str, Any] = {"step": step, "loss": float(values[0] / values[1]), "lr": lr,
                              "per_rank_rate": float(slowest[0]), "ranks": comm.size}
    for i, key in enumerate(keys):
        record[key] = float(values[2 + i]) / comm.size
    ranks_end = 2 + len(keys) + comm.size
    record["rank_busy_s"] = [float(v) for v in values[2 + len(keys):ranks_end]]
    record["node_link_s"] = [float(v) for v in values[ranks_end:]]
    return record
