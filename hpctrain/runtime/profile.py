"""Per-step timings for the scaling planner (``hpctrain plan``): compute, input and reduction wait of every
step, how long before the end of backward each gradient bucket was ready, the gradient bytes, and the
start-up time. Rank 0 writes them to ``RUN_DIR/profile.json`` (format: docs/planning.md, "The profile").
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

from hpctrain.files import write_atomic

PROFILE_FILE = "profile.json"
VERSION = 1
SKIP_STEPS = 3  # first steps pay one-off costs (oneDNN kernel selection, allocator warm-up, page faults)
WRITE_EVERY_S = 30.0


class RunningStat:
    """Mean and standard deviation of a stream of numbers (Welford), without keeping them."""

    def __init__(self) -> None:
        self.count, self.mean, self._m2 = 0, 0.0, 0.0

    def add(self, x: float) -> None:
        self.count += 1
        delta = x - self.mean
        self.mean += delta / self.count
        self._m2 += delta * (x - self.mean)

    @property
    def std(self) -> float:
        return math.sqrt(self._m2 / (self.count - 1)) if self.count > 1 else 0.0

    def as_dict(self) -> dict[str, float]:
        return {"mean": self.mean, "std": self.std, "count": self.count}


def process_age_s() -> float | None:
    """Seconds since this process started (Linux /proc), None elsewhere."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return max(0.0, uptime - started)


def node_cpu_jiffies() -> tuple[int, int] | None:
    """(busy, total) clock ticks of all the node's CPUs since boot (Linux /proc/stat), None elsewhere. Busy
    counts user, nice, system, irq, softirq and steal (time the hypervisor ran something else)."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    except (OSError, ValueError):
        return None
    if len(fields) < 8:
        return None
    user, nice, system, idle, iowait, irq, softirq, steal = fields
    busy = user + nice + system + irq + softirq + steal
    return busy, busy + idle + iowait


class NodeLoad:
    """How many of the node's CPUs other work kept busy while the run trained: the node's busy CPU time over
    the timed steps (/proc/stat) less the run's own (this rank's CPU time x its ranks on the node). Unlike the
    load average, it covers exactly the timed interval: what ran before (or a previous run) does not count."""

    def __init__(self, ranks_per_node: int) -> None:
        self.ranks_per_node = ranks_per_node
        self.cpus = os.cpu_count() or 1
        self._start: tuple[tuple[int, int], float] | None = None
        self._end: tuple[tuple[int, int], float] | None = None

    def mark(self) -> None:
        """Call at the start of the first timed step, then whenever the figures are written (the last call
        ends the interval)."""
        jiffies = node_cpu_jiffies()
        if jiffies is None:
            return
        point = (jiffies, time.process_time())
        if self._start is None:
            self._start = point
        else:
            self._end = point

    def as_dict(self) -> dict[str, float] | None:
        if self._start is None or self._end is None:
            return None
        (busy0, total0), cpu0 = self._start
        (busy1, total1), cpu1 = self._end
        if total1 <= total0:
            return None
        busy_cpus = self.cpus * (busy1 - busy0) / (total1 - total0)
        wall = (total1 - total0) / os.sysconf("SC_CLK_TCK") / self.cpus
        own = self.ranks_per_node * (cpu1 - cpu0) / wall if wall > 0 else 0.0
        return {"busy_cpus": busy_cpus, "own_cpus": own, "background_cpus": max(0.0, busy_cpus - own)}


class StepProfiler:
    """Call ``begin()``, ``mark("input")``, ``mark("backward")``, ``mark("reduced")``, ``end()`` in each step.

    The reducer's buckets give the layout and, through its ``timeline``, when each bucket was launched (=
    ready: buckets launch as their gradients land); an AdaComp combiner's ``adacomp_bytes`` the wire ratio.
    """

    def __init__(self, path: Path | None, *, model: Any, reducer: Any, combiner_state: Any, ranks: int,
                 ranks_per_node: int, threads_per_rank: int, backend: str, combiner: str, samples_per_step: int,
                 sample_unit: str, precision: str = "float32") -> None:
        self.path = path
        self.combiner_state = combiner_state
        self.reducer = reducer
        if reducer is not None and hasattr(reducer, "timeline"):
            reducer.timeline = []
        self.info = {"version": VERSION, "ranks": ranks, "ranks_per_node": ranks_per_node,
                     "threads_per_rank": threads_per_rank, "backend": backend, "combiner": combiner,
                     "samples_per_step": samples_per_step, "sample_unit": sample_unit, "precision": precision,
                     "grad_bytes": sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)}
        self.stats = {k: RunningStat() for k in ("compute_s", "input_s", "reduction_wait_s", "step_s", "cpu_s",
                                                 "loop_s", "control_s", "overlap_window_s")}
        self.leads: list[RunningStat] = []
        self.startup_s: float | None = None
        self.wire_ratio: float | None = None
        self.node_load = NodeLoad(ranks_per_node)
        # the measuring node's size: its figures (a share of its CPUs, its load) mean nothing on another node
        self.info["node_threads"] = self.node_load.cpus
        self._marks: dict[str, float] = {}
        self._cpu = 0.0
        self._seen = 0
        self._written = time.monotonic()

    def begin(self) -> None:
        now = time.perf_counter()
        if self.startup_s is None:
            self.startup_s = process_age_s()
        if self._seen > SKIP_STEPS and "begin" in self._marks:
            # begin to begin: the step plus what the loop does between steps (the stop vote every step, the
            # metrics every log_every, checkpoints when due): what a step really costs in wall time
            self.stats["loop_s"].add(now - self._marks["begin"])
        self._marks = {"begin": now}
        self._cpu = time.process_time()
        if self.reducer is not None and getattr(self.reducer, "timeline", None) is not None:
            self.reducer.timeline.clear()
        if self._seen == SKIP_STEPS:  # the first timed step begins
            self.node_load.mark()

    def mark(self, label: str) -> None:
        self._marks[label] = time.perf_counter()

    def end(self) -> None:
        m, now, cpu = self._marks, time.perf_counter(), time.process_time() - self._cpu
        self._seen += 1
        if self._seen <= SKIP_STEPS or not {"begin", "input", "backward", "reduced"} <= m.keys():
            return
        self.stats["input_s"].add(m["input"] - m["begin"])
        self.stats["compute_s"].add((m["backward"] - m["input"]) + (now - m["reduced"]))
        self.stats["reduction_wait_s"].add(m["reduced"] - m["backward"])
        self.stats["step_s"].add(now - m["begin"])
        self.stats["cpu_s"].add(cpu)  # CPU time of all the rank's threads: below step_s x threads when starved
        self._bucket_leads(m["backward"])
        adacomp = getattr(self.combiner_state, "adacomp_bytes", None)
        if adacomp:
            dense, wire = sum(v[0] for v in adacomp.values()), sum(v[1] for v in adacomp.values())
            self.wire_ratio = wire / dense if dense else None
        if self.path is not None and time.monotonic() - self._written > WRITE_EVERY_S:
            self.write()

    def control(self, seconds: float) -> None:
        """Time of the step's control collective (the stop vote after the step), once steps are timed."""
        if self._seen > SKIP_STEPS:
            self.stats["control_s"].add(seconds)

    def _bucket_leads(self, backward_end: float) -> None:
        timeline = getattr(self.reducer, "timeline", None) if self.reducer is not None else None
        if not timeline:
            return
        launched = {index: t for event, index, t in timeline if event == "launch"}
        if not launched:
            return
        buckets = getattr(self.reducer, "buckets", [])
        while len(self.leads) < len(buckets):
            self.leads.append(RunningStat())
        for b, stat in zip(buckets, self.leads, strict=False):
            t = launched.get(b.index, backward_end)
            stat.add(max(0.0, backward_end - t))
        self.stats["overlap_window_s"].add(max(0.0, backward_end - min(launched.values())))

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.info)
        out.update({k: s.as_dict() for k, s in self.stats.items() if k != "overlap_window_s"})
        out["overlap_window_s"] = self.stats["overlap_window_s"].mean
        buckets = getattr(self.reducer, "buckets", []) if self.reducer is not None else []
        out["buckets"] = [{"bytes": b.flat.numel() * b.flat.element_size(),
                           "lead_s": self.leads[i].mean if i < len(self.leads) else 0.0}
                          for i, b in enumerate(buckets)]
        out["wire_ratio"] = self.wire_ratio
        out["startup_s"] = self.startup_s
        out["loadavg"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
        out["node_cpus"] = self.node_load.as_dict()
        return out

    def write(self) -> None:
        """Replace the profile file atomically (a reader never sees half a file)."""
        if self.path is None or self.stats["compute_s"].count == 0:
            return
        self.node_load.mark()
        try:
            # advisory and rewritten every few seconds while training: not worth an fsync each time
            write_atomic(self.path, json.dumps(self.as_dict(), indent=1), durable=False)
        except OSError:
            pass  # a full disk must not stop training: the profile is advisory
        self._written = time.monotonic()


def start_profile(job: Any, run_dir: Path, comm: Any, model: Any, reducer: Any, combiner: Any,
                  task: Any, precision: str = "float32") -> StepProfiler:
    """The step profiler of a training run; rank 0 writes ``RUN_DIR/profile.json``, other ranks write nothing."""
    return StepProfiler(run_dir / PROFILE_FILE if comm.rank == 0 else None, model=model, reducer=reducer,
                        combiner_state=combiner,
                        ranks=comm.size, ranks_per_node=max(1, comm.size // job.resources.nodes),
                        threads_per_rank=job.resources.threads_per_rank, backend=comm.backend,
                        combiner=job.train.combiner.name, samples_per_step=task.samples_per_step,
                        sample_unit=task.sample_unit, precision=precision)
