"""The synchronous data-parallel training loop behind ``hpctrain run``.

One loop for every model: the task gives batches and a loss, the reducer combines gradients in fused
buckets during backward (or Adasum combines the optimizer's update, or DaSGD averages models with a
delay), the LR schedule sets the rate, checkpoints are written at step boundaries, and a walltime or
preemption signal stops the run after a checkpoint so the job can be requeued.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from hpctrain.config.job import JobSpec
from hpctrain.config.preflight import steps_per_epoch
from hpctrain.errors import RuntimeFailure
from hpctrain.launch_env import detect_launch_env
from hpctrain.models.registry import build_task
from hpctrain.models.task import TaskContext, TrainingTask
from hpctrain.runtime.combine import DelayedAverager, layer_kind
from hpctrain.runtime.comm import Communicator, make_communicator
from hpctrain.runtime.intel import maybe_optimize, wanted_from_env
from hpctrain.runtime.metrics import MetricsLog
from hpctrain.runtime.optim import apply_deltas, build_optimizer, delta_step
from hpctrain.runtime.profile import start_profile
from hpctrain.runtime.reducer import Reducer, broadcast_model, check_sync
from hpctrain.runtime.schedule import LRSchedule

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


def pick_device(job: JobSpec, local_rank: int) -> torch.device:
    if job.resources.gpus_per_rank > 0 and torch.cuda.is_available():
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device("cpu")


class GradientExchange:
    """Hides which combiner runs: call ``after_backward`` then ``optimizer_step`` then ``after_step``."""

    def __init__(self, job: JobSpec, model: torch.nn.Module, comm: Communicator,
                 optimizer: torch.optim.Optimizer) -> None:
        cfg = job.train.combiner
        self.name, self.comm, self.model, self.optimizer = cfg.name, comm, model, optimizer
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.delta_mode = cfg.name == "adasum" and cfg.adasum_on == "delta"
        reducer_combiner = {"mean": "mean", "adasum": "adasum", "adacomp": "adacomp", "dasgd": "none"}[cfg.name]
        bin_len = None
        if cfg.name == "adacomp" and set(cfg.bin_len.values()) and len(set(cfg.bin_len.values())) == 1:
            bin_len = next(iter(cfg.bin_len.values()))
        self.adacomp_bytes: dict[str, list[int]] = {}  # layer kind -> [dense bytes, wire bytes] this interval
        self.reducer = Reducer(model, comm, combiner=reducer_combiner, compression=cfg.compression,
                               bucket_mb=cfg.bucket_mb, adacomp_bin_len=bin_len, prescaled=cfg.name == "mean")
        if self.delta_mode:
            # Gradients stay local during backward; the reducer later combines the update in its buckets.
            self.reducer.close()
        self.averager = DelayedAverager(self._start_average, cfg.period, cfg.delay) if cfg.name == "dasgd" else None

    @property
    def ranks_in_sync(self) -> bool:
        """Whether every rank holds the same parameters and optimizer state after a step."""
        return not self.delta_mode and self.averager is None

    def zero_grad(self) -> None:
        self.reducer.zero_grad()

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()``, the loss scaled by 1/ranks for the mean (the reducer then only sums)."""
        scale = self.reducer.loss_scale
        (loss * scale if scale != 1.0 else loss).backward()

    def after_backward(self) -> None:
        if not self.delta_mode:
            self.reducer.finish()
        if self.name == "adacomp":
            self._count_adacomp()

    def _count_adacomp(self) -> None:
        """Add this step's dense and wire bytes per layer kind (elements as sent, one float64 scale per layer)."""
        for b in self.reducer.buckets:
            for i, p in enumerate(b.params):
                count, per_element = b.sent[i]
                totals = self.adacomp_bytes.setdefault(layer_kind(b.names[i], p.dim()), [0, 0])
                totals[0] += p.numel() * p.element_size()
                totals[1] += count * per_element + 8
    def interval_metrics(self) -> dict[str, float]:
        """AdaComp's achieved compression ratio per layer kind since the last call (dense / wire bytes)."""
        out = {f"adacomp_ratio_{kind}": dense / wire for kind, (dense, wire) in sorted(self.adacomp_bytes.items())}
        self.adacomp_bytes = {}
        return out

    def optimizer_step(self) -> None:
        if not self.delta_mode:
            self.optimizer.step()
            return
        deltas = delta_step(self.optimizer, self.params)
        with torch.no_grad():
            for p, d in zip(self.params, deltas, strict=True):
                p.grad.copy_(d)
        self.reducer.finish()  # launches every bucket: Adasum over the updates, not the gradients
        apply_deltas(self.params, [p.grad for p in self.params])

    def after_step(self) -> None:
        if self.averager is not None:
            self.averager.after_step(self.params)
            if self.averager.in_flight:
                self.comm.progress()  # MPI advances a non-blocking average only when MPI is called

    def finish_training(self) -> None:
        """DaSGD: merge what is in flight, then average the models once more so every rank ends identical."""
        if self.averager is None:
            return
        self.averager.flush(self.params)
        averaged = self._start_average([p.detach().clone() for p in self.params]).wait()
        with torch.no_grad():
            for p, avg in zip(self.params, averaged, strict=True):
                p.copy_(avg)

    def _start_average(self, tensors: list[torch.Tensor]) -> Any:
        flat = torch.cat([t.reshape(-1) for t in tensors])
        handle = self.comm.allreduce_async_(flat, "sum", "dasgd average")
        comm_size = self.comm.size

        class _Pending:
            def wait(self_inner) -> list[torch.Tensor]:
                handle.wait()
                flat.div_(comm_size)
                out, offset = [], 0
                for t in tensors:
                    out.append(flat[offset : offset + t.numel()].view_as(t))
                    offset += t.numel()
                return out

        return _Pending()

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {}
        if self.name == "adacomp":
            state["residues"] = [[r.clone() for r in b.residues] for b in self.reducer.buckets]
        if self.averager is not None:
            # The in-flight average is waited for but not merged early: saving must not change the trajectory.
            state["dasgd"] = self.averager.state_dict(include_in_flight=True)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "residues" in state:
            for b, residues in zip(self.reducer.buckets, state["residues"], strict=True):
                for mine, saved in zip(b.residues, residues, strict=True):
                    mine.copy_(saved)
        if "dasgd" in state and self.averager is not None:
            self.averager.load_state_dict(state["dasgd"])


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
        return _train_with(job, run_dir, comm, env.local_rank, check_sync_every,
                           intel_extension=wanted_from_env(environ))
    finally:
        comm.close()


def _train_with(job: JobSpec, run_dir: Path, comm: Communicator, local_rank: int,
                check_sync_every: int, intel_extension: bool = False) -> TrainOutcome:
    from hpctrain.checkpoint.session import CheckpointSession

    rank, size = comm.rank, comm.size
    run_dir.mkdir(parents=True, exist_ok=True)
    device = pick_device(job, local_rank)
    ctx = TaskContext(model_args=dict(job.model_args), data=dict(job.data), batch_per_rank=job.train.batch_per_rank,
                      seed=job.train.seed, rank=rank, world_size=size, run_dir=run_dir, device=device,
                      barrier=lambda: comm.barrier("data preparation"))
    task: TrainingTask = build_task(job.model, ctx)
    model = task.model.to(device)
    broadcast_model(model, comm)
    schedule = LRSchedule.from_spec(job.schedule_config(), size, steps_per_epoch(job, size))
    optimizer = build_optimizer(model.parameters(), job.train.optimizer.model_dump(exclude_none=True),
                                lr=schedule.lr_at(0))
    model, optimizer, _ = maybe_optimize(model, optimizer, wanted=intel_extension, device=device,
                                         announce=rank == 0)
    task.model = model  # IPEX optimizes in place; keep the task's reference the one that is trained
    exchange = GradientExchange(job, model, comm, optimizer)
    session = CheckpointSession(job, run_dir, comm, task=task, model=model, optimizer=optimizer,
                                schedule=schedule, exchange=exchange)
    start = session.restore()
    metrics = MetricsLog(run_dir / "metrics.jsonl" if rank == 0 else None, job.train.steps, task.sample_unit)
    clip = getattr(task, "clip_gradients", None)
    profiler = start_profile(job, run_dir, comm, model, exchange.reducer, exchange, task)  # for `hpctrain plan`
    loss_sum, loss_count, interval_start, interval_steps = 0.0, 0, time.perf_counter(), 0
    step = start
    stopped = False
    try:
        while step < job.train.steps:
            profiler.begin()
            lr = schedule.lr_at(step)
            for group in optimizer.param_groups:
                group["lr"] = lr
            batch = task.next_batch()
            profiler.mark("input")
            exchange.zero_grad()
            loss, aux = task.forward_loss(batch)
            if not torch.isfinite(loss):
                raise RuntimeFailure(f"rank {rank}: loss is {loss.item()} at step {step}",
                                     hint="lower train.lr or check the data")
            exchange.backward(loss)
            profiler.mark("backward")
            exchange.after_backward()
            profiler.mark("reduced")
            if clip is not None:
                clip()
            exchange.optimizer_step()
            exchange.after_step()
            task.observe(batch, aux)
            profiler.end()
            step += 1
            loss_sum, loss_count, interval_steps = loss_sum + float(loss.detach()), loss_count + 1, interval_steps + 1
            if step % job.train.log_every == 0 or step == job.train.steps:
                rate = interval_steps * task.samples_per_step / (time.perf_counter() - interval_start)
                record = _interval_record(comm, task, step, lr, loss_sum, loss_count, rate,
                                          exchange.interval_metrics())
                if rank == 0:
                    metrics.write(record)
                loss_sum, loss_count, interval_start, interval_steps = 0.0, 0, time.perf_counter(), 0
            if check_sync_every and step % check_sync_every == 0 and exchange.ranks_in_sync:
                differing = check_sync(model, comm)
                if differing:
                    names = ", ".join(differing[:5])
                    raise RuntimeFailure(f"parameters differ across ranks after step {step}: {names}")
            if step == job.train.steps:
                exchange.finish_training()  # before the final checkpoint, so it holds the model every rank has
            if session.due(step) or step == job.train.steps:
                session.save(step)
            if session.stop_requested(step):
                if not session.saved_at(step):
                    session.save(step)
                stopped = step < job.train.steps
                break
    finally:
        profiler.write()
        metrics.close()
        session.close()
    if exchange.averager is not None:
        exchange.averager.flush(exchange.params)
    final = task.evaluate() if rank == 0 and not stopped else {}
    if final and rank == 0:
        metrics = MetricsLog(run_dir / "metrics.jsonl", job.train.steps, task.sample_unit)
        metrics.write({"step": step, "final": True, **final})
        metrics.close()
    return TrainOutcome(start_step=start, end_step=step, stopped_by_signal=stopped, final=final,
                        parameters_checksum=parameters_checksum(model))


def _interval_record(comm: Communicator, task: TrainingTask, step: int, lr: float, loss_sum: float,
                     loss_count: int, rate: float, exchange_metrics: dict[str, float] | None = None
                     ) -> dict[str, Any]:
    """Loss averaged over all ranks, task and exchange metrics averaged, rate the slowest rank's samples/s."""
    local = {**task.interval_metrics(), **(exchange_metrics or {})}
    keys = sorted(local)
    values = torch.tensor([loss_sum, float(loss_count), *[local[k] for k in keys]], dtype=torch.float64)
    comm.allreduce_(values, "sum", "metrics")
    slowest = torch.tensor([rate], dtype=torch.float64)
    comm.allreduce_(slowest, "min", "metrics rate")
    record: dict[str, Any] = {"step": step, "loss": float(values[0] / values[1]), "lr": lr,
                              "per_rank_rate": float(slowest[0]), "ranks": comm.size}
    for i, key in enumerate(keys):
        record[key] = float(values[2 + i]) / comm.size
    return record
