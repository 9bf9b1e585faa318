"""What the training loop saves and restores, and when: the bridge between the trainer and the store.

Saved: model, optimizer, LR schedule position and step (shared when all ranks agree, per rank when a
combiner lets them differ), every rank's RNG states and data position, and the combiner's ``state_dict``
(AdaComp residues, DaSGD's in-flight average). Saves are written in the background and committed together
at a step boundary; a walltime/preemption signal only raises a flag that all ranks agree on at a step boundary.
"""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from hpctrain.checkpoint.exchange import CommExchange, Exchange
from hpctrain.checkpoint.rng import capture_rng_state, restore_rng_state
from hpctrain.checkpoint.signals import StopFlag
from hpctrain.checkpoint.store import CheckpointStore
from hpctrain.checkpoint.store_fields import NodeGroup, WorkTally
from hpctrain.checkpoint.store_write import PendingSave
from hpctrain.config.job import JobSpec
from hpctrain.config.staging import node_local_root
from hpctrain.launch_env import detect_launch_env

log = logging.getLogger("hpctrain.checkpoint")

# Test hooks (docs/checkpoints.md): raise the stop flag after this step, exactly as a walltime signal would; or
# hold every rank after this step until a stop is agreed, so that a real signal finds training under way.
STOP_AT_STEP_ENV = "HPCTRAIN_STOP_AT_STEP"
HOLD_AT_STEP_ENV = "HPCTRAIN_HOLD_AT_STEP"
HOLD_VOTE_S = 0.2  # while held: seconds between the ranks' votes


class CombinerState(Protocol):
    """What a checkpoint needs of the gradient combiner (runtime/combiners/base.py's ``Combiner`` is one)."""

    @property
    def ranks_in_sync(self) -> bool:
        """Whether every rank holds the same parameters and optimizer state after a step."""

    def flush(self) -> None:
        """Merge into the parameters whatever is still in flight."""

    def state_dict(self) -> dict[str, Any]:
        """This rank's combiner state for an exact resume."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``state_dict()`` (same world size)."""

    def elastic_restart(self, step: int) -> None:
        """Resuming ``step`` on another world size: the per-rank state starts afresh."""


class CheckpointSession:
    """Owns the checkpoint store and the stop flag of one training run on one rank.

    Collective calls (every rank, same order, main thread only): ``restore``, ``save``,
    ``stop_requested``, ``finish``. ``background=False`` makes every save synchronous.
    """

    def __init__(self, job: JobSpec, run_dir: Path, comm: Any, *, task: Any, model: torch.nn.Module,
                 optimizer: torch.optim.Optimizer, schedule: Any, combiner: CombinerState, background: bool = True,
                 environ: dict[str, str] | None = None, tally: WorkTally | None = None) -> None:
        self.job, self.comm = job, comm
        self.task, self.model, self.optimizer, self.schedule, self.combiner = task, model, optimizer, schedule, combiner
        directory = Path(job.checkpoint.dir)
        if not directory.is_absolute():
            directory = run_dir / directory
        environ = os.environ if environ is None else environ
        exchange = CommExchange(comm) if comm.size > 1 else None
        self.store = CheckpointStore(directory, keep=job.checkpoint.keep, rank=comm.rank, world_size=comm.size,
                                     exchange=exchange, node=node_group(job, comm, exchange, environ), tally=tally)
        self.flag = StopFlag().install(tuple(sorted({job.checkpoint.signal, "TERM"})))
        self.background = background
        self._stop_at = _step_from(environ, STOP_AT_STEP_ENV)
        self._hold_at = _step_from(environ, HOLD_AT_STEP_ENV)
        self._vote_every = job.checkpoint.stop_check_every
        self._last_saved: int | None = None
        self._pending: PendingSave | None = None
        self._stopping = False

    # --------------------------------------------------------------------------------- step boundaries

    def close(self) -> None:
        """Give the signals back; let a background write end (locally: never a collective on this path)."""
        self.flag.uninstall()
        if self._pending is not None:
            self._pending.wait()  # its files are whole; without a commit the checkpoint does not count
        self.store.close()

    def due(self, step: int) -> bool:
        return step % self.job.checkpoint.every_steps == 0

    def saved_at(self, step: int) -> bool:
        return self._last_saved == step

    def stop_requested(self, step: int | None = None) -> bool:
        """True on every rank once any rank received the stop signal (decided together at a step boundary).

        The ranks vote after every ``checkpoint.stop_check_every``-th step (and the last, and the test hooks'
        steps): a signal is acted on at the next vote, and between votes this returns False without a collective.
        The same all-reduce also tells whether every rank has finished writing a background save; if so it
        is committed here. When a stop is agreed, a save still in flight is committed before returning.
        At the hold hook's step the ranks vote again and again (every rank gets the same answer) until one of
        them has received the stop signal.
        """
        if step is not None and step == self._stop_at:
            self.flag.set()
        elif (step is not None and step % self._vote_every and step < self.job.train.steps
              and step != self._hold_at):
            return False
        held = step is not None and step == self._hold_at
        if held and self.comm.rank == 0:
            log.info("holding after step %d until a stop signal (%s)", step, HOLD_AT_STEP_ENV)
        while not self._vote():
            if not held:
                return False
            time.sleep(HOLD_VOTE_S)
        self._stopping = True
        self.finish()
        return True

    def _vote(self) -> bool:
        """One stop vote (collective): True on every rank when any rank's flag is up."""
        pending = self._pending
        writing = pending is not None and not pending.done()
        votes = torch.tensor([1.0 if self.flag.requested() else 0.0, 1.0 if writing else 0.0], dtype=torch.float64)
        self.comm.allreduce_(votes, "max", "stop flag")
        if pending is not None and votes[1] == 0:
            self.finish()
        if votes[0] == 0:
            return False
        if not self.flag.requested():
            self.flag.set()
        return True

    def finish(self) -> None:
        """Wait for a save in flight and commit it; collective. Raises CheckpointError on every rank if it failed."""
        pending, self._pending = self._pending, None
        if pending is not None:
            self.store.commit(pending)

    # ------------------------------------------------------------------------------------------- save

    def save(self, step: int) -> None:
        """Checkpoint ``step``; collective. The last step and a stop are saved synchronously, others in the
        background (the previous background save is committed first, so at most one is in flight)."""
        self.finish()
        final = step >= self.job.train.steps
        if final:
            self.combiner.flush()  # training ends here: the final model has everything that was in flight
        shared, per_rank = self._state(step)
        if final or self._stopping or not self.background:
            self.store.save(step, shared, per_rank=per_rank)
        else:
            self._pending = self.store.save_async(step, shared, per_rank=per_rank)
        self._last_saved = step

    def _state(self, step: int) -> tuple[dict[str, Any], dict[str, Any]]:
        """(shared state, only filled on rank 0; this rank's state)."""
        in_sync = self.combiner.ranks_in_sync
        # "exchange": the key checkpoints have always had for the combiner's state
        per_rank: dict[str, Any] = {"rng": capture_rng_state(), "task": self.task.state_dict(),
                                    "exchange": self.combiner.state_dict()}
        if not in_sync:
            per_rank["model"] = self.model.state_dict()
            per_rank["optimizer"] = self.optimizer.state_dict()
        if self.comm.rank != 0:
            return {}, per_rank
        shared: dict[str, Any] = {
            "step": step, "schedule": self.schedule.state_dict(), "world_size": self.comm.size,
            "spec_hash": self.job.spec_hash(), "model_name": self.job.model,
            "model_args": getattr(self.task, "model_args", dict(self.job.model_args)),
            "model": self.model.state_dict(),  # when ranks differ: rank 0's, for inference and elastic restarts
            "task": per_rank["task"],  # rank 0's data position: an elastic restart re-shards from it
        }
        if in_sync:
            shared["optimizer"] = self.optimizer.state_dict()
        return shared, per_rank

    # ---------------------------------------------------------------------------------------- restore

    def restore(self) -> int:
        """Load the newest valid checkpoint if there is one; returns the step to continue from."""
        loaded = self.store.load_newest()
        if loaded is None:
            return 0
        checkpoint, shared, rank_state = loaded
        step = int(shared["step"])
        if checkpoint.world_size == self.comm.size and rank_state is not None:
            self.model.load_state_dict(rank_state.get("model", shared["model"]))
            optimizer_state = rank_state.get("optimizer", shared.get("optimizer"))
            if optimizer_state is not None:
                self.optimizer.load_state_dict(optimizer_state)
            self.schedule.load_state_dict(shared["schedule"])
            restore_rng_state(rank_state["rng"])
            self.task.load_state_dict(rank_state["task"])
            self.combiner.load_state_dict(rank_state.get("exchange", {}))
        else:
            self._elastic(shared, checkpoint.world_size, step)
        if self.comm.rank == 0:
            log.info("resumed from %s (step %d)", checkpoint.path, step)
        self._last_saved = step
        return step

    def _elastic(self, shared: dict[str, Any], old_world: int, step: int) -> None:
        """Resume on another world size: shared model (and optimizer when ranks agreed), data re-sharded from
        rank 0's position, the LR schedule as built for this world size, fresh RNGs and combiner state."""
        if self.comm.rank == 0:
            log.warning("resuming step %d on %d ranks from a checkpoint of %d ranks: data is re-sharded and the "
                        "learning rate re-scaled; the result will not be bit-identical to an uninterrupted run",
                        step, self.comm.size, old_world)
        self.model.load_state_dict(shared["model"])
        if shared.get("optimizer") is not None:
            self.optimizer.load_state_dict(shared["optimizer"])
        if "task" in shared:
            self.task.load_state_dict(shared["task"])
        seed = (self.job.train.seed * 1_000_003 + step) * 1_009 + self.comm.rank
        random.seed(seed)
        np.random.seed(seed % 2**32)
        torch.manual_seed(seed)
        self.combiner.elastic_restart(step)


def _step_from(environ: Mapping[str, str], name: str) -> int | None:
    value = environ.get(name, "")
    return int(value) if value.strip() else None


def node_group(job: JobSpec, comm: Any, exchange: Exchange | None, environ: Mapping[str, str]) -> NodeGroup | None:
    """One checkpoint file per node (``checkpoint.layout: node``, the default) for a run of several ranks, where
    every rank has node-local storage to hand its state over; else None (one file per rank). Collective."""
    if comm.size == 1 or exchange is None or job.checkpoint.layout != "node":
        return None
    root = node_local_root(environ)
    local_size = detect_launch_env(environ).local_size
    usable = root is not None and 0 <= comm.local_rank < local_size
    if exchange.any(not usable):  # all ranks take the same layout, or a node would wait for a rank that never comes
        if comm.rank == 0:
            log.warning("checkpoint.layout is node but a rank has no node-local storage (no $HPCTRAIN_NODE_LOCAL, "
                        "no writable /dev/shm) or no local rank: writing one file per rank")
        return None
    attempt = exchange.bcast(os.urandom(8).hex() if comm.rank == 0 else None)  # this run's own hand-off directory
    assert root is not None
    return NodeGroup(comm.local_rank, local_size, root / f"hpctrain-checkpoint-{attempt}",
                     float(job.train.collective_timeout_s))
