"""K data-parallel workers simulated in one process, each a rank as ``runtime/trainer.py`` runs it.

Every worker has its own task (its shard of the data), model, optimizer and combiner, built on rank k of an
in-process group (``in_process.py``), and takes the trainer's steps; the combiner runs its ordinary per-rank
path (``launch`` for every bucket, then whatever it does around the optimizer: Adasum's step on the update,
DaSGD's delayed average), and its collectives meet the other workers' in memory. Each worker is a thread that
waits in a collective as a rank does; one runs at a time, so a run is deterministic. Use it to
try a combiner at a rank count you do not have before a large run; docs/convergence.md shows it against the
combiners' papers and against real ranks.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hpctrain.config.job import JobSpec
from hpctrain.config.preflight import steps_per_epoch
from hpctrain.errors import RuntimeFailure
from hpctrain.models.registry import build_task
from hpctrain.models.task import TaskContext, TrainingTask
from hpctrain.runtime.combiners import Combiner, GradBucket, build_combiner
from hpctrain.runtime.optim import build_optimizer
from hpctrain.runtime.reducer import Reducer
from hpctrain.runtime.schedule import LRSchedule
from hpctrain_bench.in_process import Crew, InProcessComm, InProcessGroup

GRADIENTS = ("per_worker", "batched")


class Diverged(RuntimeFailure):
    """A worker's loss stopped being finite (what the trainer stops a run for)."""

    def __init__(self, worker: int, step: int, loss: float) -> None:
        super().__init__(f"worker {worker}: loss is {loss} at step {step}", hint="lower train.lr or check the data")
        self.worker, self.step = worker, step


@dataclass
class SimulationResult:
    """What a simulated run produced. Losses are the workers' local losses averaged, as the trainer logs them."""

    workers: int
    steps: int  # steps taken (fewer than asked when the run diverged)
    losses: list[float] = field(default_factory=list)  # one per step
    lrs: list[float] = field(default_factory=list)
    intervals: list[dict[str, float]] = field(default_factory=list)  # task and combiner metrics per log interval
    evaluations: list[tuple[int, dict[str, float]]] = field(default_factory=list)  # (step, worker 0's evaluate())
    final: dict[str, float] = field(default_factory=dict)  # worker 0's evaluate() at the end
    state: dict[str, torch.Tensor] = field(default_factory=dict)  # worker 0's model state at the end
    diverged_at: int | None = None
    seconds: float = 0.0


class _Worker:
    """One simulated rank: the objects ``_train_with`` builds on a rank, with a bucket layout shared by all."""

    def __init__(self, rank: int, task: TrainingTask, optimizer: torch.optim.Optimizer, combiner: Combiner,
                 reducer: SimulatedReducer) -> None:
        self.rank, self.task, self.optimizer, self.combiner, self.reducer = rank, task, optimizer, combiner, reducer
        self.model = task.model
        self.params = dict(task.model.named_parameters())
        self.buffers = dict(task.model.named_buffers())
        self.loss = math.nan


class SimulatedReducer:
    """What a combiner needs of its reducer, for one simulated worker: the buckets (rows of buffers shared by
    every worker, in the real reducer's layout, each ``p.grad`` a view into them) and ``finish()``, which
    launches every bucket in bucket order through the combiner (the last one blocking, as the reducer does) and
    waits for them."""

    def __init__(self, buckets: list[GradBucket], named: dict[str, torch.Tensor]) -> None:
        self.buckets = buckets
        self.combiner: Combiner | None = None
        self._slots = [(named[name], b.views[i]) for b in buckets for i, name in enumerate(b.names)]
        for p, view in self._slots:
            p.grad = view

    def zero_grad(self) -> None:
        for b in self.buckets:
            b.flat.zero_()
        for p, view in self._slots:
            if p.grad is not view:
                p.grad = view

    def gather(self) -> None:
        """Every ``p.grad`` back into its bucket view (autograd may have replaced one), as the reducer does."""
        with torch.no_grad():
            for p, view in self._slots:
                g = p.grad
                if g is view:
                    continue
                if g is None:
                    view.zero_()
                elif g.data_ptr() != view.data_ptr():
                    view.copy_(g)
                p.grad = view

    def finish(self) -> None:
        self.gather()
        assert self.combiner is not None
        last = len(self.buckets) - 1
        handles = [self.combiner.launch(b, blocking=b.index == last) for b in self.buckets]
        for handle in handles:
            if handle is not None:
                handle.wait()

    def close(self) -> None:
        return None


class Simulation:
    """``job`` trained by ``workers`` simulated ranks; ``run()`` returns a ``SimulationResult``.

    ``gradients``: ``per_worker`` runs each worker's forward and backward as a rank does (the reference);
    ``batched`` computes all workers' gradients in one ``torch.func.vmap`` call (the same values to float
    rounding, much faster for many workers; the task's ``forward_loss`` must be vmappable and its batches
    tensors or tuples of tensors). ``eval_every``: worker 0's ``task.evaluate()`` every that many steps.
    ``stop_on_divergence``: a non-finite loss ends the run with ``diverged_at`` set instead of raising.
    """

    def __init__(self, job: JobSpec, workers: int, run_dir: Path, *, gradients: str = "per_worker",
                 eval_every: int = 0, stop_on_divergence: bool = False,
                 observe: Callable[[int, list[_Worker]], None] | None = None) -> None:
        if workers < 1:
            raise ValueError(f"Simulation: workers must be >= 1, got {workers}")
        if gradients not in GRADIENTS:
            raise ValueError(f"Simulation: gradients must be one of {GRADIENTS}, not {gradients!r}")
        self.job, self.size, self.run_dir = job, workers, Path(run_dir)
        self.gradients, self.eval_every, self.stop_on_divergence = gradients, eval_every, stop_on_divergence
        self.observe = observe  # called between steps with (step, workers), e.g. to record per-layer metrics
        self.schedule = LRSchedule.from_spec(job.schedule_config(), workers, steps_per_epoch(job, workers))
        self.group = InProcessGroup(workers)
        self.workers = self._build_workers()

    # ------------------------------------------------------------------------------------------------ setup

    def _context(self, rank: int) -> TaskContext:
        return TaskContext(model_args=dict(self.job.model_args), data=dict(self.job.data),
                           batch_per_rank=self.job.train.batch_per_rank, seed=self.job.train.seed, rank=rank,
                           world_size=self.size, run_dir=self.run_dir, device=torch.device("cpu"))

    def _build_workers(self) -> list[_Worker]:
        tasks = [build_task(self.job.model, self._context(k)) for k in range(self.size)]
        start = tasks[0].model.state_dict()
        for t in tasks[1:]:  # broadcast_model: every rank starts from rank 0's parameters and buffers
            t.model.load_state_dict(start)
        train = self.job.train
        # The bucket layout of the real reducer (the same bucket_mb), over buffers with one row per worker.
        layout = Reducer(tasks[0].model, InProcessComm(self.group, 0), None, bucket_mb=train.combiner.bucket_mb)
        layout.close()
        rows = [torch.zeros(self.size, b.flat.numel(), dtype=b.flat.dtype) for b in layout.buckets]
        out = []
        for k, task in enumerate(tasks):
            params = [p for p in task.model.parameters() if p.requires_grad]
            buckets = [b.with_flat(rows[j][k]) for j, b in enumerate(layout.buckets)]
            reducer = SimulatedReducer(buckets, dict(task.model.named_parameters()))
            optimizer = build_optimizer(task.model.parameters(), train.optimizer.model_dump(exclude_none=True),
                                        lr=self.schedule.lr_at(0))
            combiner = build_combiner(train.combiner, InProcessComm(self.group, k), params)
            combiner.attach(reducer)
            reducer.combiner = combiner
            out.append(_Worker(k, task, optimizer, combiner, reducer))
        self._rows = rows
        return out

    # ------------------------------------------------------------------------------------------ gradients

    def _batched_gradients(self, batches: list[Any]) -> list[tuple[torch.Tensor, Any]]:
        """Every worker's scaled gradient written into its bucket views; returns each worker's (loss, aux)."""
        from torch.func import functional_call, grad, vmap

        w0 = self.workers[0]
        params = {n: torch.stack([w.params[n].detach() for w in self.workers]) for n in w0.params}
        buffers = {n: torch.stack([w.buffers[n] for w in self.workers]) for n in w0.buffers}
        scale = w0.combiner.loss_scale
        wrapper = _LossOf(w0.task)

        def scaled_loss(p: dict[str, torch.Tensor], b: dict[str, torch.Tensor], batch: Any) -> tuple[torch.Tensor, Any]:
            state = {f"model.{n}": t for n, t in {**p, **b}.items()}
            loss, aux = functional_call(wrapper, state, (batch,))
            return loss * scale if scale != 1.0 else loss, (loss.detach(), aux)

        grads, (losses, auxes) = vmap(grad(scaled_loss, has_aux=True))(params, buffers, _stack(batches))
        with torch.no_grad():
            for row, b in zip(self._rows, w0.reducer.buckets, strict=True):
                for i, (name, off, p) in enumerate(zip(b.names, b.offsets, b.params, strict=True)):
                    if p.is_contiguous():  # one copy for all workers
                        row[:, off : off + p.numel()].copy_(grads[name].reshape(self.size, -1))
                    else:  # a channels-last gradient: its view knows the layout
                        for w in self.workers:
                            w.reducer.buckets[b.index].views[i].copy_(grads[name][w.rank])
        return [(losses[k], _index(auxes, k)) for k in range(self.size)]

    # ---------------------------------------------------------------------------------------------- steps

    def _step(self, step: int, last: bool) -> Callable[[int], None]:
        lr = self.schedule.lr_at(step)

        def run(k: int) -> None:
            w = self.workers[k]
            for group in w.optimizer.param_groups:
                group["lr"] = lr
            batch = w.task.next_batch()
            w.reducer.zero_grad()
            if self.gradients == "batched":
                loss, aux = self.group.arrive(k, "gradients", batch, self._batched_gradients)()
            else:
                loss, aux = w.task.forward_loss(batch)
            w.loss = float(loss.detach())
            if not math.isfinite(w.loss):
                raise Diverged(k, step, w.loss)
            if self.gradients == "per_worker":
                scale = w.combiner.loss_scale
                (loss * scale if scale != 1.0 else loss).backward()
            w.combiner.after_backward()
            clip = getattr(w.task, "clip_gradients", None)
            if clip is not None:
                clip()
            w.combiner.optimizer_step(w.optimizer)
            w.combiner.after_step()
            w.task.observe(batch, aux)
            if last:
                w.combiner.finish_training()

        return run

    def run(self) -> SimulationResult:
        train = self.job.train
        result = SimulationResult(workers=self.size, steps=0)
        started = time.perf_counter()
        crew = self.group.crew = Crew(self.size)
        try:
            for step in range(train.steps):
                last = step == train.steps - 1
                try:
                    crew.run(self._step(step, last))
                except Diverged as exc:
                    if not self.stop_on_divergence:
                        raise
                    result.diverged_at = exc.step
                    break
                done = step + 1
                result.steps = done
                result.losses.append(sum(w.loss for w in self.workers) / self.size)
                result.lrs.append(self.schedule.lr_at(step))
                if done % train.log_every == 0 or last:
                    result.intervals.append(self._interval(done))
                if self.eval_every and done % self.eval_every == 0 and not last:
                    result.evaluations.append((done, self.workers[0].task.evaluate()))
                if self.observe is not None:
                    self.observe(done, self.workers)
            if result.diverged_at is None:
                crew.run(lambda k: self.workers[k].combiner.flush())
                result.final = self.workers[0].task.evaluate()
                result.evaluations.append((result.steps, result.final))
        finally:
            crew.close()
            self.group.crew = None
        result.state = {k: v.detach().clone() for k, v in self.workers[0].model.state_dict().items()}
        result.seconds = time.perf_counter() - started
        return result

    def _interval(self, step: int) -> dict[str, float]:
        """The task's and the combiner's interval metrics averaged over workers, as the trainer logs them."""
        totals: dict[str, float] = {}
        for w in self.workers:
            for key, value in {**w.task.interval_metrics(), **w.combiner.interval_metrics()}.items():
                totals[key] = totals.get(key, 0.0) + value
        return {"step": float(step), **{k: v / self.size for k, v in totals.items()}}


def simulate(job: JobSpec, workers: int, run_dir: Path, **options: Any) -> SimulationResult:
    """``Simulation(job, workers, run_dir, **options).run()``."""
    return Simulation(job, workers, run_dir, **options).run()


class _LossOf(nn.Module):
    """The task's ``forward_loss`` as a module whose parameters are the task model's, for ``functional_call``."""

    def __init__(self, task: TrainingTask) -> None:
        super().__init__()
        self.model = task.model
        object.__setattr__(self, "task", task)  # not a submodule: its model is registered once, above

    def forward(self, batch: Any) -> tuple[torch.Tensor, Any]:
        return self.task.forward_loss(batch)


def _stack(trees: list[Any]) -> Any:
    first = trees[0]
    if isinstance(first, torch.Tensor):
        return torch.stack(trees)
    if isinstance(first, tuple | list):
        return type(first)(_stack([t[i] for t in trees]) for i in range(len(first)))
    raise RuntimeFailure(f"batched gradients need tensor batches, this task gives {type(first).__name__}",
                         hint="simulate it with gradients='per_worker'")


def _index(tree: Any, k: int) -> Any:
    if isinstance(tree, torch.Tensor):
        return tree[k]
    if isinstance(tree, tuple | list):
        return type(tree)(_index(t, k) for t in tree)
    if isinstance(tree, dict):
        return {key: _index(v, k) for key, v in tree.items()}
    return tree
