"""Check that a job spec fits its site profile before anything is rendered or submitted.

Each refusal is a FitError naming the limit: the queue's policies (config/queue_policy.py), the node's cores,
threads, GPUs or memory, or a backend the site cannot run. Limits of the scheduler itself (the local
one runs on one node) are its back-end's: ``hpctrain.submission.schedulers.base.place`` checks both.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpctrain.config.job import JobSpec
from hpctrain.config.node_shape import NodeShape
from hpctrain.config.origin import key_path, locate
from hpctrain.config.queue_policy import choose_queue
from hpctrain.config.site import DEVICE_BACKENDS, Queue, SiteProfile
from hpctrain.errors import ConfigError, FitError


@dataclass(frozen=True)
class Placement:
    """Where a job runs once it fits: the queue, its limits, the node shape and the backend; the execution queue a
    routing queue sends it to, notes on what was chosen for it, and whether its script may requeue it (the queue's
    policy, ``no_requeue_reason`` says why not)."""

    queue_name: str | None
    queue: Queue | None
    node: NodeShape
    backend: str
    account: str | None
    execution_queue: str | None = None
    notes: tuple[str, ...] = ()
    requeue: bool = True
    no_requeue_reason: str | None = None


def check_fit(job: JobSpec, site: SiteProfile) -> Placement:
    """The job's placement on the site, or a FitError that says which limit it breaks, placed at the file line
    or the flag (``--set``, ``--nodes``) that set the key."""
    try:
        return _fit(job, site)
    except FitError as exc:
        raise locate(exc, job.origin) from None


def _per_node_threads_key(job: JobSpec, hw_threads: int) -> str:
    """Which of ranks_per_node and threads_per_rank to name when their product does not fit a node: the one a
    flag set, else ranks_per_node when it alone is too many, else threads_per_rank."""
    keys = ("resources.ranks_per_node", "resources.threads_per_rank")
    origin = job.origin
    flagged = [k for k in keys if origin is not None and origin.flag_for(key_path(k))]
    if len(flagged) == 1:
        return flagged[0]
    return keys[0] if job.resources.ranks_per_node > hw_threads else keys[1]


def _fit(job: JobSpec, site: SiteProfile) -> Placement:
    res = job.resources
    where = f"site {site.name!r}"
    try:
        queue_name, queue = site.queue(res.queue)
    except ConfigError as exc:
        raise FitError(exc.message, key="resources.queue", hint=exc.hint) from None
    node = site.node_for(queue_name)
    assert isinstance(node.cores, int) and isinstance(node.gpus, int) and not isinstance(node.memory_gb, str)

    choice = None
    if queue is not None:
        assert queue_name is not None
        try:
            choice = choose_queue(site, queue_name, queue, res.allocated_nodes, res.walltime)
        except FitError as exc:
            if not res.spare_nodes:
                raise
            raise FitError(f"{exc.message} ({res.nodes} to train on and {res.spare_nodes} spare)",
                           key="resources.spare_nodes" if res.nodes <= queue.max_nodes else exc.key,
                           hint=exc.hint) from None
    hw_threads = node.cores * node.threads_per_core
    wanted = res.ranks_per_node * res.threads_per_rank
    if wanted > hw_threads:
        raise FitError(
            f"{res.ranks_per_node} ranks x {res.threads_per_rank} threads = {wanted} per node, but a node of {where}"
            f" has {node.cores} cores x {node.threads_per_core} threads = {hw_threads}",
            key=_per_node_threads_key(job, hw_threads), hint="lower ranks_per_node or threads_per_rank")
    if res.gpus_per_rank > 0 and node.gpus == 0:
        raise FitError(f"{res.gpus_per_rank} GPUs per rank requested but {where} has no GPUs"
                       + (f" in queue {queue_name!r}" if queue_name else ""),
                       key="resources.gpus_per_rank", hint="set gpus_per_rank: 0 or pick a GPU queue")
    if res.gpus_per_rank * res.ranks_per_node > node.gpus:
        raise FitError(f"{res.ranks_per_node} ranks x {res.gpus_per_rank} GPUs per node requested but a node of "
                       f"{where} has {node.gpus}", key="resources.gpus_per_rank")
    if res.memory_gb is not None and res.memory_gb > node.memory_gb:
        raise FitError(f"{res.memory_gb} GB per node requested but a node of {where} has {node.memory_gb} GB",
                       key="resources.memory_gb")
    account = res.account or site.account
    if site.account_required and not account:
        raise FitError(f"{where} needs an account (allocation/project) to charge",
                       key="resources.account", hint="set resources.account or the site's account")

    backend = job.train.comm_backend
    if backend == "auto":
        backend = (queue.comm_backend if queue and queue.comm_backend else None) or site.comm_backend
        if backend in DEVICE_BACKENDS.values() and res.gpus_per_rank == 0:
            backend = "gloo"  # a CPU-only job on a GPU site: NCCL/XCCL cannot run, gloo always can
    if backend in DEVICE_BACKENDS.values():
        if res.gpus_per_rank == 0:
            raise FitError(f"comm_backend {backend} needs GPUs: set resources.gpus_per_rank", key="train.comm_backend")
        wanted = DEVICE_BACKENDS.get(node.gpu_kind)
        if backend != wanted:
            raise FitError(f"comm_backend {backend} cannot reduce on {node.gpu_kind} GPUs of {where}",
                           key="train.comm_backend", hint=f"use {wanted} (or auto, mpi, gloo)")
    if choice is None:
        return Placement(queue_name=queue_name, queue=queue, node=node, backend=backend, account=account)
    return Placement(queue_name=queue_name, queue=queue, node=node, backend=backend, account=account,
                     execution_queue=choice.execution_queue, notes=choice.notes, requeue=choice.requeue,
                     no_requeue_reason=choice.no_requeue_reason)
