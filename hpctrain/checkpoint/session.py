"""What the training loop saves and restores, and when: the bridge between the trainer and the store.

Saved: model, optimizer, LR schedule position and step (shared when all ranks agree, per rank when a
combiner lets them differ), every rank's RNG states and data position, and combiner state (AdaComp
residues, DaSGD counters). A walltime/preemption signal only raises a flag; all ranks agree on it at a
step boundary and checkpoint together.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from hpctrain.checkpoint.rng import capture_rng_state, restore_rng_state
from hpctrain.checkpoint.signals import StopFlag
from hpctrain.checkpoint.store import CheckpointStore, comm_gather
from hpctrain.config.job import JobSpec

log = logging.getLogger("hpctrain.checkpoint")


class CheckpointSession:
    """Owns the checkpoint store and the stop flag of one training run on one rank."""

    def __init__(self, job: JobSpec, run_dir: Path, comm: Any, *, task: Any, model: torch.nn.Module,
                 optimizer: torch.optim.Optimizer, schedule: Any, exchange: Any) -> None:
        self.job, self.comm = job, comm
        self.task, self.model, self.optimizer, self.schedule, self.exchange = task, model, optimizer, schedule, exchange
        directory = Path(job.checkpoint.dir)
        if not directory.is_absolute():
            directory = run_dir / directory
        self.store = CheckpointStore(directory, keep=job.checkpoint.keep, rank=comm.rank, world_size=comm.size,
                                     gather=comm_gather(comm) if comm.size > 1 else None)
        self.flag = StopFlag().install(tuple(sorted({job.checkpoint.signal, "TERM"})))
        self._last_saved: int | None = None

    def close(self) -> None:
        self.flag.uninstall()

    def due(self, step: int) -> bool:
        return step % self.job.checkpoint.every_steps == 0

    def saved_at(self, step: int) -> bool:
        return self._last_saved == step

    def stop_requested(self) -> bool:
        """True on every rank once any rank received the stop signal (decided together at a step boundary)."""
        def any_rank(value: int) -> int:
            flag = torch.tensor([float(value)], dtype=torch.float64)
            self.comm.allreduce_(flag, "max", "stop flag")
            return int(flag[0])

        return self.flag.agree(any_rank)

    def save(self, step: int) -> None:
        in_sync = self.exchange.ranks_in_sync
        exchange_state = self.exchange.state_dict()
        shared: dict[str, Any] = {"step": step, "schedule": self.schedule.state_dict(),
                                  "world_size": self.comm.size, "spec_hash": self.job.spec_hash(),
                                  "model_args": getattr(self.task, "model_args", dict(self.job.model_args)),
                                  "model_name": self.job.model}
        per_rank: dict[str, Any] = {"rng": capture_rng_state(), "task": self.task.state_dict(),
                                    "exchange": exchange_state}
        if in_sync:
            shared["model"] = self.model.state_dict()
            shared["optimizer"] = self.optimizer.state_dict()
        else:
            shared["model"] = self.model.state_dict()  # rank 0's, for inference and elastic restarts
            per_rank["model"] = self.model.state_dict()
            per_rank["optimizer"] = self.optimizer.state_dict()
        self.store.save(step, shared if self.comm.rank == 0 else {}, per_rank=per_rank)
        self._last_saved = step

    def restore(self) -> int:
        """Load the newest valid checkpoint if there is one; returns the step to continue from."""
        checkpoint = self.store.latest_valid()
        if checkpoint is None:
            return 0
        shared, rank_state = self.store.load(checkpoint)
        self.model.load_state_dict(shared["model"])
        same_world = int(shared.get("world_size", self.comm.size)) == self.comm.size
        if rank_state is not None and "model" in rank_state:
            self.model.load_state_dict(rank_state["model"])
        optimizer_state = (rank_state or {}).get("optimizer", shared.get("optimizer"))
        if optimizer_state is not None:
            self.optimizer.load_state_dict(optimizer_state)
        step = int(shared["step"])
        if same_world and rank_state is not None:
            self.schedule.load_state_dict(shared["schedule"])
            restore_rng_state(rank_state["rng"])
            self.task.load_state_dict(rank_state["task"])
            self.exchange.load_state_dict(rank_state.get("exchange", {}))
        else:
            log.warning("resuming step %d on %d ranks from a checkpoint of %s ranks: data is re-sharded and the "
                        "learning rate re-scaled; the result will not be bit-identical to an uninterrupted run",
                        step, self.comm.size, shared.get("world_size"))
            self._reshard(step)
        if self.comm.rank == 0:
            log.info("resumed from %s (step %d)", checkpoint.path, step)
        self._last_saved = step
        return step

    def _reshard(self, step: int) -> None:
        """Elastic restart: the data position continues from the samples consumed so far, split anew."""
        state = self.task.state_dict()
        if "stream" in state:
            consumed = step * self.job.train.batch_per_rank
            state["stream"] = {"epoch": 0, "offset": 0, "consumed": consumed}
        try:
            self.task.load_state_dict(state)
        except (KeyError, ValueError):
            pass
