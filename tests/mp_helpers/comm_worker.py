"""Worker run under a real launcher (mpiexec, torchrun, srun) by tests/test_env.py and tests/test_comm.py.

``python comm_worker.py env``                     prints this rank's LaunchEnv as one JSON line
``python comm_worker.py collectives BACKEND``     checks every collective against hand-computed values, and
                                                  that closing stops the back-end's native threads
``python comm_worker.py hang BACKEND TIMEOUT R``  rank R sleeps before collective #3; the job must abort
``python comm_worker.py train SPEC RUN_DIR``      runs train() (gloo), then prints which gloo threads are left
``python comm_worker.py store K PAUSE DIR``       counts on: one all-reduce (start-up), then K all-reduces
                                                  PAUSE s apart (training), close; writes DIR/rank-R.json:
                                                  the rank's store counts and its last all-reduce
``python comm_worker.py transport DIR``           writes DIR/rank-R.json: how MPI was started (the variables
                                                  hpctrain set, whether UCX was brought up: thread, transports)
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch  # noqa: E402

from hpctrain.launch_env import detect_launch_env  # noqa: E402
from hpctrain.runtime.comm.backends import make_communicator  # noqa: E402


def collectives(backend: str) -> None:
    comm = make_communicator(backend, timeout_s=60)
    # As the trainer does: its first optimizer imports torch._dynamo, and with it torch.distributed.nn.functional,
    # after the group exists (that import once kept the group, and its threads, alive past close()).
    torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1)
    r, n = comm.rank, comm.size
    t = torch.full((5,), float(r + 1))
    comm.allreduce_(t)
    assert torch.equal(t, torch.full((5,), n * (n + 1) / 2)), t
    m = torch.arange(6, dtype=torch.float64).reshape(2, 3) * (r + 1)
    comm.allreduce_(m, op="mean")
    assert torch.allclose(m, torch.arange(6, dtype=torch.float64).reshape(2, 3) * (n + 1) / 2), m
    mx = torch.tensor([float(r)])
    comm.allreduce_(mx, op="max")
    assert mx.item() == n - 1
    half = torch.full((4,), float(r + 1), dtype=torch.float16)
    comm.allreduce_(half)
    assert half.dtype == torch.float16 and torch.equal(half.float(), torch.full((4,), n * (n + 1) / 2))
    bf = torch.full((3,), float(r + 1), dtype=torch.bfloat16)
    comm.allreduce_(bf)
    assert bf.dtype == torch.bfloat16 and torch.equal(bf.float(), torch.full((3,), n * (n + 1) / 2))
    strided = torch.arange(12, dtype=torch.float32).reshape(3, 4).t()  # not contiguous
    comm.allreduce_(strided)
    assert torch.equal(strided, torch.arange(12, dtype=torch.float32).reshape(3, 4).t() * n)
    handles = [(comm.allreduce_async_(x, label=f"bucket {i}"), x) for i, x in
               enumerate(torch.full((1000,), float(r * 10 + i)) for i in range(3))]
    for i, (h, x) in enumerate(handles):
        h.wait()
        assert torch.equal(x, torch.full((1000,), float(sum(q * 10 + i for q in range(n)))))
    b = torch.full((3,), float(r)) if r else torch.tensor([7.0, 8.0, 9.0])
    comm.broadcast_(b, root=0)
    assert torch.equal(b, torch.tensor([7.0, 8.0, 9.0]))
    bbf = torch.full((2,), 1.5 if r == 0 else 0.0, dtype=torch.bfloat16)
    comm.broadcast_(bbf, root=0)
    assert torch.equal(bbf.float(), torch.tensor([1.5, 1.5]))
    g = comm.allgather(torch.tensor([r, r * r], dtype=torch.int64))
    assert [x.tolist() for x in g] == [[q, q * q] for q in range(n)], g
    v = comm.allgather_varlen(torch.arange(r + 1, dtype=torch.int32))
    assert [x.tolist() for x in v] == [list(range(q + 1)) for q in range(n)], v
    if n % 2 == 0:
        peer = r ^ 1
        got = comm.sendrecv(torch.full((3,), float(r)), peer)
        assert torch.equal(got, torch.full((3,), float(peer)))
    comm.barrier()
    kept = comm.allreduce_async_(torch.ones(4), label="waited, handle kept")  # a caller may keep handles
    kept.wait()
    before = native_threads()
    comm.close()
    if backend == "gloo":
        assert GLOO_THREADS & before, before  # the check below sees these threads when they exist
        left = GLOO_THREADS & native_threads()
        assert not left, f"rank {r}: still running after close(): {sorted(left)}"
    print(f"rank {r}/{n} {backend} collectives OK on {socket.gethostname()}", flush=True)


# gloo's work loops and transport loop, and the TCPStore server (rank 0): a process that reaches interpreter
# shutdown with these still running can die in std::terminate instead of exiting with its status.
GLOO_THREADS = {"pt_gloo_runloop", "gloo_tcp_loop", "pt_tcpstore_uv"}


def native_threads() -> set[str]:
    """Names of this process's threads as the kernel lists them (native threads included)."""
    names = set()
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                names.add(f.read().strip())
        except OSError:  # the thread ended while we looked
            continue
    return names


def train_then_threads(spec: str, run_dir: str) -> None:
    """``train()`` as ``hpctrain run`` calls it, then: which of gloo's threads are still running."""
    from pathlib import Path

    from hpctrain.config.job import load_job
    from hpctrain.runtime.trainer import train

    outcome = train(load_job(spec), Path(run_dir), backend="gloo")
    left = GLOO_THREADS & native_threads()
    print(f"rank {detect_launch_env(os.environ).rank}: trained to step {outcome.end_step}; gloo threads left: "
          f"{sorted(left)}", flush=True)


def hang(backend: str, timeout_s: float, stuck: int) -> None:
    comm = make_communicator(backend, timeout_s=timeout_s)
    t = torch.ones(8)
    comm.allreduce_(t, label="warm-up")
    comm.barrier()
    if comm.rank == stuck:
        print(f"rank {stuck} going to sleep before collective #3", flush=True)
        time.sleep(3600)
    comm.allreduce_(t, label="bucket 3")
    print(f"rank {comm.rank}: collective #3 completed (unexpected)", flush=True)


def store_counts(steps: int, pause_s: float, out_dir: str) -> None:
    """The rank's calls to the rendezvous store in each phase (runtime/counting/store_counts.py), over real gloo
    ranks."""
    from hpctrain.runtime.counting import counters, store_counts, work_counts

    counters.enable()
    comm = make_communicator("gloo", timeout_s=10)
    t = torch.ones(4)
    comm.allreduce_(t, label="bucket 0")
    work_counts.step_done()  # the first step ends start-up, as in the trainer
    for _ in range(steps):
        time.sleep(pause_s)  # the watchdog ticks meanwhile: nothing of it may reach the store
        t = torch.full((4,), float(comm.rank))
        comm.allreduce_(t, label="bucket 1")
        work_counts.step_done()
    report = {"rank": comm.rank, "size": comm.size, "sum": t.tolist(), "tick_s": comm._watchdog.tick_s}
    comm.close()
    report.update(store_counts.sections()["store"])
    with open(os.path.join(out_dir, f"rank-{report['rank']}.json"), "w") as f:
        json.dump(report, f)


def transport(out_dir: str) -> None:
    comm = make_communicator("mpi", timeout_s=60)
    t = torch.ones(3)
    comm.allreduce_(t)
    with open("/proc/self/maps") as f:
        ucx_transports = sorted({line.rsplit("/", 1)[-1].strip() for line in f if "libuct_" in line})
    report = {"rank": comm.rank, "sum": t.tolist(), "ucx_transports": ucx_transports,
              "threads": sorted(native_threads()),
              "set": {k: os.environ.get(k) for k in ("MPICH_CH4_NETMOD", "FI_PROVIDER", "FI_TCP_IFACE")}}
    comm.close()
    # One file per rank: lines two ranks print at once can reach mpiexec's stdout joined on one line.
    with open(os.path.join(out_dir, f"rank-{report['rank']}.json"), "w") as f:
        json.dump(report, f)


def main(argv: list[str]) -> None:
    torch.set_num_threads(1)
    if argv[0] == "env":
        print(json.dumps(dataclasses.asdict(detect_launch_env(os.environ))), flush=True)
    elif argv[0] == "collectives":
        collectives(argv[1])
    elif argv[0] == "store":
        store_counts(int(argv[1]), float(argv[2]), argv[3])
    elif argv[0] == "transport":
        transport(argv[1])
    elif argv[0] == "train":
        train_then_threads(argv[1], argv[2])
    elif argv[0] == "hang":
        hang(argv[1], float(argv[2]), int(argv[3]))
    else:
        raise SystemExit(f"unknown mode {argv[0]!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
