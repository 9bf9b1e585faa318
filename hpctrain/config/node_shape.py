"""The node shape of a site profile: cores, hardware threads, sockets, GPUs and their order, memory, and the per-queue
changes to it. Checked on load (config/site.py reads it into SiteProfile.node and each queue's node)."""

from __future__ import annotations

import os
from typing import Annotated, Literal

from pydantic import Field, model_validator

from hpctrain.config.common import MAX_COUNT, FieldProblem, Strict

Count = Annotated[int, Field(le=MAX_COUNT)]
GpuKind = Literal["none", "nvidia", "amd", "intel"]
# Memory of one node or device, GB: 1 PiB, beyond any machine (and ``memory_gb * 1024`` stays exact).
MAX_MEMORY_GB = float(1 << 20)
# Latencies, bandwidths and rates of the network block: a trillion in any unit is a typo, not a machine.
MAX_RATE = 1e12


class NodeShape(Strict):
    """One compute node: what a rank count, thread count and GPU request are checked against."""

    cores: Count | Literal["auto"] = Field(description="Physical cores per node usable by jobs ('auto': this machine)")
    threads_per_core: int = Field(1, ge=1, le=8, description="Hardware threads per core (SMT)")
    task_threads_per_core: int | None = Field(
        None, ge=1, le=8, description="Hardware threads per core Slurm lays a task out on unless the job asks for "
        "more (Frontier: 1, so --cpus-per-task counts physical cores); unset: all of threads_per_core")
    sockets: int = Field(1, ge=1, le=64, description="CPU sockets; hpctrain's list binding never splits a rank "
                         "across two")
    reserved_cores: list[int] = Field(
        default_factory=list, description="Ids of the physical cores the system keeps for itself (Aurora: 0 and 52); "
        "cores counts the others, so the node has cores + len(reserved_cores) in all")
    gpus: Count | Literal["auto"] = Field(0, description="Devices a rank can be given per node: GPUs, or GCDs "
                                          "(Frontier: 8) or tiles (Aurora: 12) where each is its own device")
    gpu_kind: GpuKind = "none"
    devices_per_gpu: int = Field(1, ge=1, le=16, description="Devices (GCDs, tiles) per physical GPU package; "
                                 "PBS's ngpus counts packages")
    gpu_order: list[int] | None = Field(
        None, description="Device ids in the order of the cores they sit next to (Polaris: [3, 2, 1, 0], cores 0-7 "
        "are GPU 3's); ranks spread over the cores in order get devices from this list")
    gpu_memory_gb: float | None = Field(None, gt=0, le=MAX_MEMORY_GB,
        description="Memory of one device (GCD, tile, GPU), GB")
    memory_gb: Annotated[float, Field(le=MAX_MEMORY_GB)] | Literal["auto"] = Field(
        description="Main memory per node in GB ('auto': this machine)")
    hbm_gb: float | None = Field(None, ge=0, le=MAX_MEMORY_GB,
        description="On-package high-bandwidth memory (e.g. KNL MCDRAM)")
    cpu: str | None = Field(None, description="Processor model, for documentation")
    all_core_speed: float | None = Field(
        None, gt=0, le=1, description="A thread's compute speed with every hardware thread busy, relative to one "
        "thread alone (lower clocks, shared caches and memory bandwidth); for the planner, 1 when unset")
    rank_speed_spread: float | None = Field(
        None, ge=0, lt=1, description="Spread (standard deviation over mean) of the speed at which ranks on "
        "different cores or nodes run the same work, held over a run; for the planner's straggler term, 0 when unset")

    @model_validator(mode="after")
    def _positive(self) -> NodeShape:
        if isinstance(self.cores, int) and self.cores < 1:
            raise FieldProblem(("cores",), "cores must be at least 1")
        if isinstance(self.gpus, int) and self.gpus < 0:
            raise FieldProblem(("gpus",), "gpus cannot be negative")
        if isinstance(self.memory_gb, float | int) and self.memory_gb <= 0:
            raise FieldProblem(("memory_gb",), "memory_gb must be positive")
        if self.gpus not in (0, "auto") and self.gpu_kind == "none":
            raise FieldProblem(("gpu_kind",), "a node with GPUs needs gpu_kind (nvidia, amd or intel)")
        _check_topology(self)
        return self

    @property
    def physical_cores(self) -> int:
        """Every core of the node, the reserved ones included (what core ids count up to)."""
        assert isinstance(self.cores, int)
        return self.cores + len(self.reserved_cores)

    def resolved(self) -> NodeShape:
        """This shape with 'auto' values read from the machine the code runs on."""
        cores = (os.cpu_count() or 1) if self.cores == "auto" else self.cores
        memory = _machine_memory_gb() if self.memory_gb == "auto" else self.memory_gb
        gpus = 0 if self.gpus == "auto" else self.gpus
        return self.model_copy(update={"cores": cores, "memory_gb": memory, "gpus": gpus})


def _check_topology(node: NodeShape) -> None:
    """Reserved cores, sockets and the device order must describe one node consistently."""
    if isinstance(node.cores, int):
        total = node.physical_cores
        if len(set(node.reserved_cores)) != len(node.reserved_cores) or any(
                not 0 <= c < total for c in node.reserved_cores):
            raise FieldProblem(("reserved_cores",), f"reserved_cores must be distinct core ids below {total} "
                               "(cores + the reserved ones)")
        if total % node.sockets:
            raise FieldProblem(("sockets",), f"{total} cores do not split evenly over {node.sockets} sockets")
    if isinstance(node.gpus, int):
        if node.gpus % node.devices_per_gpu:
            raise FieldProblem(("devices_per_gpu",), f"{node.gpus} devices are not whole GPUs of "
                               f"{node.devices_per_gpu} devices each")
        if node.gpu_order is not None and sorted(node.gpu_order) != list(range(node.gpus)):
            raise FieldProblem(("gpu_order",), f"gpu_order must list each device id 0..{node.gpus - 1} once")


class NodeOverride(Strict):
    """Per-queue changes to the node shape (e.g. Perlmutter's CPU nodes versus its GPU nodes)."""

    cores: int | None = Field(None, ge=1, le=MAX_COUNT)
    threads_per_core: int | None = Field(None, ge=1, le=8)
    sockets: int | None = Field(None, ge=1, le=64)
    gpus: int | None = Field(None, ge=0, le=MAX_COUNT)
    gpu_kind: GpuKind | None = None
    gpu_order: list[int] | None = None
    memory_gb: float | None = Field(None, gt=0, le=MAX_MEMORY_GB)
    hbm_gb: float | None = Field(None, ge=0, le=MAX_MEMORY_GB)
    cpu: str | None = None


def _machine_memory_gb() -> float:
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9, 1)
    except (ValueError, OSError, AttributeError):
        return 1.0
