"""The bad-input probe's reproductions against the real CLI: ``hpctrain report``/``status``, ``ffn segment``/
``evaluate``, ``jobs validate`` and ``run`` with their ``metrics:`` sinks, each given a hostile input (JSON nested
100,000 deep, /dev/zero, FIFOs, files declaring shapes of 10^9-10^36 voxels, absurd -o, RUN and --threads, escaping
sink paths, a refused tracking server, an empty checkpoint manifest, ESC/BEL in run files).

Each case is ``python -m hpctrain ...`` in its own process (this repository first on the path, a fresh registry),
killed at 120 s (a hang); its peak resident memory is the child's ru_maxrss from os.wait4. A case passes when its
output holds no traceback, no Python warning and no raw ESC/BEL; it did not hang; its peak stayed under 200 MB (1 GB
for the cases that train or segment, which import torch); and either it exited non-zero with one short readable
error line last on stderr naming the problem, or, where the product's documented answer is a success with a warning
or a note (listed under the table with the reason), it exited 0 with that warning or note in its output. Some cases
also check what the command left behind (the page, a directory it must not create).
The hostile files are built by this script in a child process (it imports h5py/numpy/torch/zarr), so that this
process stays small: the children start by vfork and their ru_maxrss includes this process's own peak, which the
summary prints. Left out: a remote run's fetches (needs ssh; tests/test_report_hostile.py runs them over a stand-in
ssh) and the report of 10^6 records (benchmarks/report.py --records 1000000).

    .venv/bin/python benchmarks/hostile_inputs.py [--only WORD] [--keep]

Prints a table (case | exit | seconds | peak MB | last line | verdict) and exits 1 if any case fails.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import re
import resource
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TIMEOUT_S = 120
PEAK_MB, TORCH_MB = 200, 1024
DEEP = "[" * 100_000
CONTROL = ("\x1b", "\x07", "\x9b")
PY_WARNING = re.compile(r"^\S.*:\d+: \w*Warning: ", re.MULTILINE)  # a library's warning, source line and all
RUN_FILES = ("metrics.jsonl", "attempts.jsonl", "rank_times.jsonl", "profile.json", "scores.json", "failure.txt",
             "checkpoints/manifest.json", "ranks/node-00000.txt")
SEGMENTATIONS = {"3x12000x12000": ((3, 12000, 12000), "uint64", (1, 256, 256)),
                 "1x1e6x1e6": ((1, 10**6, 10**6), "uint64", (1, 256, 256)),
                 "1e9x2x2": ((10**9, 2, 2), "int8", (1024, 2, 2))}
DECLARED = {"4096^3-u8": ((4096,) * 3, "uint8"), "1x2^30x2^30-u8": ((1, 1 << 30, 1 << 30), "uint8"),
            "2048^3-u64": ((2048,) * 3, "uint64"), "1024^3-u8": ((1024,) * 3, "uint8"),
            "1024^3-i32": ((1024,) * 3, "int32")}
SPEC = """name: hostile
model: resnet
model_args: {{channels: 4, blocks: 1}}
data: {{holdout: 32}}
train: {{steps: 4, batch_per_rank: 8, lr: 0.05, log_every: 2}}
resources: {{nodes: 1, ranks_per_node: 1, threads_per_rank: 1, walltime: "00:05:00"}}
metrics: {metrics}
"""
SINK_SPECS = {"tb-up": "{tensorboard_dir: ../../x}", "tb-inner-up": "{tensorboard_dir: tb/../../x}",
              "uri-up": "{mlflow: {tracking_uri: ../../x}}", "uri-file-rel": "{mlflow: {tracking_uri: 'file:../m'}}",
              "tb-abs": "{tensorboard_dir: /tmp/hpctrain-hostile-tb}",
              "refused": "{mlflow: {tracking_uri: 'http://127.0.0.1:9'}}",
              "fifo-id": "{mlflow: {tracking_uri: mlruns}}"}


# --- the hostile inputs (built in a child process) ---------------------------------------------------------------


def write_run(d: Path, final: bool = False) -> Path:
    """A run directory with every file the report reads, small and well formed (no final record: it goes on)."""
    (d / "ranks").mkdir(parents=True, exist_ok=True)
    (d / "checkpoints").mkdir(exist_ok=True)
    lines = [{"time": 1000.0 + s, "step": s, "loss": 2.0 / s, "per_rank_rate": 10.0, "ranks": 2} for s in range(1, 11)]
    lines += [{"time": 2000.0, "step": 10, "final": True, "test_loss": 0.5}] if final else []
    (d / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    (d / "attempts.jsonl").write_text(json.dumps({"time": 999.0, "step": 0}) + "\n")
    (d / "rank_times.jsonl").write_text("".join(json.dumps({"step": s, "busy_s": [0.25, 0.5]}) + "\n"
                                                for s in range(1, 11)))
    (d / "profile.json").write_text(json.dumps({"ranks": 2, "ranks_per_node": 2}))
    (d / "scores.json").write_text(json.dumps({"ffn": {"voi": 1.25}}))
    (d / "checkpoints" / "manifest.json").write_text(json.dumps({"checkpoints": [{"step": 5, "files": []}]}))
    (d / "ranks" / "node-00000.txt").write_text("rank 0 pid 1 host n0 parent 1\nrank 1 pid 2 host n0 parent 1\n")
    return d


def replaced(path: Path, kind: str) -> None:
    path.unlink(missing_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")
    else:
        path.write_text('{"step": 1}\n' + DEEP + "\n" if path.suffix == ".jsonl" else DEEP + "\n")


def build(root: Path) -> None:
    """Every hostile input under ``root``; run as ``--build ROOT`` in its own process."""
    import h5py
    import numpy as np
    import torch

    from hpctrain.checkpoint.manifest import MANIFEST
    from hpctrain.checkpoint.store import CheckpointStore
    from hpctrain.ffn.model import ConvStack3D
    from hpctrain.submission.api import RunHandle, submit_runs
    from hpctrain.submission.registry import RunRegistry

    for name in ("metrics.jsonl", "profile.json", "scores.json"):
        replaced(write_run(root / f"deep-{name}") / name, "deep")
    replaced(write_run(root / "zero-metrics") / "metrics.jsonl", "dev-zero")
    for name in RUN_FILES:
        replaced(write_run(root / f"fifo-{name.replace('/', '-')}") / name, "fifo")
    os.mkfifo(write_run(root / "fifo-seg") / "heldout_segmentation.h5")
    for label, (shape, dtype, chunks) in SEGMENTATIONS.items():
        with h5py.File(write_run(root / f"seg-{label}") / "heldout_segmentation.h5", "w") as f:
            f.create_dataset("segmentation", shape=shape, dtype=dtype, chunks=chunks)  # no chunk ever written
    for label, (shape, dtype) in DECLARED.items():
        with h5py.File(root / f"{label}.h5", "w") as f:
            f.create_dataset("image", shape=shape, dtype=dtype, chunks=tuple(min(64, n) for n in shape))
    with contextlib.suppress(ImportError):
        import zarr

        zarr.create_array(str(root / "side-2^40.zarr"), shape=(1 << 40,) * 3, chunks=(64, 64, 64), dtype="uint8")
    (root / "fifo.zarr").mkdir()
    os.mkfifo(root / "fifo.zarr" / "zarr.json")
    os.mkfifo(root / "fifo.h5")
    with h5py.File(root / "vol.h5", "w") as f:
        f["image"] = np.random.default_rng(1).integers(100, 200, (16, 16, 16)).astype(np.uint8)
    # a real FFN checkpoint whose every voxel is object, as a file and as a store's steps under an empty manifest
    torch.manual_seed(0)
    model = ConvStack3D(depth=1, features=2, fov=(7, 7, 7))
    with torch.no_grad():
        model.conv_lom.bias.fill_(10.0)
    state = {"model": model.state_dict(), "model_args": {"depth": 1, "features": 2, "fov": [7, 7, 7],
                                                         "deltas": [2, 2, 2]}}
    torch.save(state, root / "model.pt")
    store = CheckpointStore(root / "ckpt", keep=3)
    for step in (10, 20):
        store.save(step, state)
    (root / "ckpt" / MANIFEST).write_text(json.dumps({"format": "hpctrain-checkpoint", "checkpoints": []}))
    control = write_run(root / "control", final=True)
    (control / "failure.txt").write_text("rank 1: bad \x1b[2J\x07value\n")
    (control / "ranks" / "node-00000.txt").write_text("rank 0 pid 1 host n\x1b[31m0 parent 1\n")
    (control / "scores.json").write_text(json.dumps({"ffn\x1b]0;title\x07": {"voi": 1.0}}))
    write_run(root / "served")
    (root / "out-dir").mkdir()
    for label, metrics in SINK_SPECS.items():
        (root / f"{label}.yaml").write_text(SPEC.format(metrics=metrics))
    (root / "fifo-id-run").mkdir()
    os.mkfifo(root / "fifo-id-run" / "mlflow-run-id")
    # a run in the registry whose last metrics line is nested 100,000 deep, for `hpctrain status`
    deep = ["python3", "-c", f"open('metrics.jsonl', 'w').write('{{\"step\": 1}}\\n' + '[' * {len(DEEP)})"]
    with RunRegistry() as registry:
        run = submit_runs(root / "refused.yaml", "local", command=deep, registry=registry).runs[0]
    RunHandle(run.run_id).wait(timeout=TIMEOUT_S, poll_s=0.5)
    (root / "status-run-id").write_text(run.run_id)


# --- running one case ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """``hpctrain ARGV``; ``want``: words its error line (or, where ``ok`` says why exit 0 is due, its output) holds."""

    name: str
    argv: tuple[str, ...]
    want: str
    ok: str = ""
    peak_mb: float = PEAK_MB
    check: Callable[[], str | None] | None = None  # after the run: what is wrong with what it left, or None
    during: Callable[[Path], str | None] | None = None  # while it runs (given its stdout file): a problem or None


@dataclass(frozen=True)
class Outcome:
    code: int | None
    seconds: float
    peak_mb: float
    last: str
    problems: list[str]


def child_env(root: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HPCTRAIN_", "MLFLOW_", "RANK", "WORLD_SIZE"))}
    env.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", HPCTRAIN_HOME=str(root / "home"),
               HPCTRAIN_RUNS=str(root / "runs"))
    return env


def readable(line: str) -> bool:
    return 0 < len(line) <= 600 and not any(ord(c) < 32 and c != "\t" or c in CONTROL for c in line)


def run_case(case: Case, root: Path, logs: Path) -> Outcome:
    """``case`` run to its end or its kill; stdout and stderr go to files in ``logs`` (no pipe to fill)."""
    out_path, err_path = logs / "stdout", logs / "stderr"
    logs.mkdir(parents=True)
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        start = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-m", "hpctrain", *case.argv], cwd=root / "cwd",
                                env=child_env(root), stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                start_new_session=True)
    hung = threading.Event()

    def kill() -> None:
        hung.set()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)

    guard = threading.Timer(TIMEOUT_S, kill)
    guard.start()
    try:
        during = case.during(out_path) if case.during else None
    except OSError as exc:  # e.g. the server it talks to has gone
        during = f"while it ran: {exc}"
    _, status, usage = os.wait4(proc.pid, 0)
    guard.cancel()
    seconds = time.monotonic() - start
    proc.returncode = code = os.waitstatus_to_exitcode(status)
    with contextlib.suppress(ProcessLookupError):  # kill the case's whole session, so that no child outlives it
        os.killpg(proc.pid, signal.SIGKILL)
    stdout, stderr = (p.read_text(errors="replace") for p in (out_path, err_path))
    lines = [line for line in stderr.splitlines() if line.strip()] or [
        line for line in stdout.splitlines() if line.strip()]
    last = lines[-1].strip() if lines else ""
    problems = [during] if during else []
    if hung.is_set():
        problems.append(f"hang: killed at {TIMEOUT_S} s")
    if "Traceback" in stderr + stdout:
        problems.append("a traceback")
    if PY_WARNING.search(stderr):
        problems.append("a Python warning on stderr")
    if any(c in stdout + stderr for c in CONTROL):
        problems.append("a raw control character in the output")
    if not readable(last):
        problems.append("last line empty, too long or with control characters")
    if case.ok:
        if code != 0:
            problems.append(f"exit {code} where a success is documented")
        if case.want not in stdout + stderr:
            problems.append(f"no {case.want!r} in the output")
    else:
        if code == 0:
            problems.append("exit 0 where an error is due")
        if "error:" not in last or case.want not in last:
            problems.append(f"last line is not the error {case.want!r}")
    peak = usage.ru_maxrss / 1024
    if peak >= case.peak_mb:
        problems.append(f"peak {peak:.0f} MB >= {case.peak_mb} MB")
    if case.check and not hung.is_set() and (wrong := case.check()):
        problems.append(wrong)
    return Outcome(code, seconds, peak, last, problems)


# --- the cases ----------------------------------------------------------------------------------------------------


def page_shows(page: Path, *words: str) -> Callable[[], str | None]:
    def check() -> str | None:
        if not page.is_file():
            return f"no page {page.name}"
        text = page.read_text(errors="replace")
        missing = [w for w in words if w not in text]
        return f"page lacks {missing}" if missing else None
    return check


def clean_page(page: Path) -> Callable[[], str | None]:
    def check() -> str | None:
        found = page_shows(page, "\\x1b[2J\\x07value", "ffn\\x1b]0;title\\x07")()
        raw = [c for c in CONTROL if page.is_file() and c in page.read_text(errors="replace")]
        return found or (f"raw {raw} in the page" if raw else None)
    return check


def serve_and_reset(run: Path) -> Callable[[Path], str | None]:
    """While ``report --serve`` runs: 20 clients reset their connections (SO_LINGER 0), one GET must answer 200,
    then the run's final record is written, after which the server ends by itself."""
    def during(stdout: Path) -> str | None:
        deadline = time.monotonic() + TIMEOUT_S
        url = ""
        while not url and time.monotonic() < deadline:
            url = next((w for w in stdout.read_text().split() if w.startswith("http://127.0.0.1:")), "")
            time.sleep(0.2)  # polls the child's first output line, which has no event to wait on
        if not url:
            return "no URL printed"
        host_port, path = url.removeprefix("http://").split("/", 1)
        host, port = host_port.split(":")
        for _ in range(20):
            client = socket.create_connection((host, int(port)), timeout=60)
            client.sendall(f"GET /{path} HTTP/1.1\r\nHost: x".encode())  # a request cut short, then a reset
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            client.close()
        conn = http.client.HTTPConnection(host, int(port), timeout=60)
        conn.request("GET", f"/{path}")
        answer = conn.getresponse().status
        conn.close()
        with open(run / "metrics.jsonl", "a") as f:
            f.write(json.dumps({"time": 2000.0, "step": 10, "final": True, "test_loss": 0.5}) + "\n")
        return None if answer == 200 else f"GET after the resets answered {answer}"
    return during


def cases(root: Path) -> list[Case]:
    html = str(root / "r.html")
    model, vol, seg_out = str(root / "model.pt"), f"{root / 'vol.h5'}:image", str(root / "seg.h5")
    long = f"{root}/{'a' * 100_000}.h5:image"
    nonexistent = Path("/nonexistent")
    found: list[Case] = []
    for name in ("metrics.jsonl", "profile.json", "scores.json"):
        found.append(Case(f"1 report deep {name}", ("report", str(root / f"deep-{name}"), "-o", html),
                          "nested deeper than 64 levels"))
    status_id = (root / "status-run-id").read_text()
    found.append(Case("1 status deep metrics line", ("status", status_id), status_id,
                      ok="a deep line is no record: status shows the run's state without it"))
    found.append(Case("2 report metrics.jsonl->/dev/zero", ("report", str(root / "zero-metrics"), "-o", html),
                      "character device"))
    for label in SEGMENTATIONS:
        out = root / f"seg-{label}.html"
        found.append(Case(f"2 report segmentation {label}", ("report", str(root / f"seg-{label}"), "-o", str(out)),
                          out.name, ok="drawn from the few voxels drawn (docs/report.md): the page is made",
                          check=page_shows(out, "heldout_segmentation.h5 z=")))
    for name in RUN_FILES:
        found.append(Case(f"3 report FIFO {name}", ("report", str(root / f"fifo-{name.replace('/', '-')}"), "-o",
                                                    html), "FIFO"))
    out = root / "fifo-seg.html"
    found.append(Case("3 report FIFO segmentation", ("report", str(root / "fifo-seg"), "-o", str(out)), out.name,
                      ok="an optional picture: the page says why it is missing",
                      check=page_shows(out, "heldout_segmentation.h5 is a FIFO (named pipe), not a regular file")))
    fifo_h5 = f"{root / 'fifo.h5'}:image"
    found += [
        Case("3 ffn evaluate FIFO volume", ("ffn", "evaluate", fifo_h5, fifo_h5), "is a FIFO (named pipe)"),
        Case("3 ffn segment FIFO volume", ("ffn", "segment", model, fifo_h5, "-o", seg_out), "is a FIFO"),
        Case("3 ffn evaluate FIFO zarr.json", ("ffn", "evaluate", str(root / "fifo.zarr"), str(root / "fifo.zarr")),
             "zarr.json is a FIFO"),
        Case("3 run FIFO mlflow-run-id", ("run", str(root / "fifo-id.yaml"), "--run-dir", str(root / "fifo-id-run"),
                                          "--backend", "none"), "is a FIFO (named pipe), not a regular file",
             ok="a sink that cannot open is one warning; training goes on", peak_mb=TORCH_MB),
        Case("4 report -o a directory", ("report", str(root / "control"), "-o", str(root / "out-dir")),
             "is a directory"),
        Case("4 report -o /proc/version", ("report", str(root / "control"), "-o", "/proc/version"),
             "cannot write the report"),
        Case("4 report -o /nonexistent/x.html", ("report", str(root / "control"), "-o", "/nonexistent/x.html"),
             "directory /nonexistent does not exist",
             check=None if nonexistent.exists() else lambda: "/nonexistent created" * nonexistent.exists() or None),
        Case("4 report ''", ("report", ""), "RUN is empty"),
        Case("4 report RUN of 100,000 chars", ("report", "a" * 100_000), "longer than any path or run id"),
        Case("6 report --serve, 20 client resets", ("report", str(root / "served"), "--serve", "--refresh", "0.5",
                                                    "-o", str(root / "served.html")), "report written to",
             ok="the served mode ends by itself after the run's final record", during=serve_and_reset(root / "served"),
             check=page_shows(root / "served.html", "<html")),
    ]
    for label in ("4096^3-u8", "1x2^30x2^30-u8", "2048^3-u64"):
        spec = f"{root / label}.h5:image"
        found.append(Case(f"7 ffn evaluate declared {label}", ("ffn", "evaluate", spec, spec), "more than the budget"))
    if (root / "side-2^40.zarr").exists():
        spec = str(root / "side-2^40.zarr")
        found.append(Case("7 ffn evaluate zarr 2^40 per side", ("ffn", "evaluate", spec, spec), "more than the budget"))
    found += [
        Case("7 ffn segment 1024^3 int32", ("ffn", "segment", model, f"{root / '1024^3-i32.h5'}:image", "-o", seg_out),
             "dtype int32; expected uint8"),
        Case("7 ffn segment 1024^3 uint8 --memory-gb 8", ("ffn", "segment", model, f"{root / '1024^3-u8.h5'}:image",
                                                          "-o", seg_out, "--memory-gb", "8"), "(--memory-gb 8)"),
        Case("7 ffn segment 1x2^30x2^30", ("ffn", "segment", model, f"{root / '1x2^30x2^30-u8.h5'}:image", "-o",
                                           seg_out), "more than the budget"),
        Case("7 ffn segment --threads -1", ("ffn", "segment", model, vol, "-o", seg_out, "--threads", "-1"),
             "threads; give 1 to"),
        Case("7 ffn segment --threads 100000", ("ffn", "segment", model, vol, "-o", seg_out, "--threads", "100000"),
             "threads; give 1 to"),
        Case("7 ffn evaluate 100k-char path", ("ffn", "evaluate", long, long), "longer than the 4095"),
        Case("7 ffn segment 100k-char path", ("ffn", "segment", model, long, "-o", seg_out), "longer than the 4095"),
    ]
    for label in ("tb-up", "tb-inner-up", "uri-up"):
        found.append(Case(f"8 jobs validate {label}", ("jobs", "validate", str(root / f"{label}.yaml")),
                          "leads out of the run directory"))
    found += [
        Case("8 jobs validate uri-file-rel", ("jobs", "validate", str(root / "uri-file-rel.yaml")),
             "is a relative file:"),
        Case("8 jobs validate tb-abs", ("jobs", "validate", str(root / "tb-abs.yaml")), "ok on",
             ok="docs/reference.md: an absolute tensorboard_dir is taken as written"),
        Case("8 run tracking_uri 127.0.0.1:9", ("run", str(root / "refused.yaml"), "--run-dir",
                                                str(root / "refused-run"), "--backend", "none"),
             "Connection refused; training goes on without it",
             ok="a refused server is one warning; rank 0 trains on", peak_mb=TORCH_MB),
        Case("9 ffn segment, empty manifest", ("ffn", "segment", str(root / "ckpt"), vol, "-o",
                                               str(root / "ckpt-seg.h5")),
             "names 0 checkpoint(s) but not step(s) 10, 20", ok="the markers' steps are used, with a warning",
             peak_mb=TORCH_MB, check=lambda: None if (root / "ckpt-seg.h5").is_file() else "nothing written"),
        Case("10 report ESC/BEL in run files", ("report", str(root / "control"), "-o", str(root / "control.html")),
             "control.html", ok="the characters are shown escaped", check=clean_page(root / "control.html")),
    ]
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="", help="run only the cases whose name holds this")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    parser.add_argument("--build", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.build:
        build(args.build)
        return 0
    root = Path(tempfile.mkdtemp(prefix="hpctrain-hostile-"))
    try:
        (root / "cwd").mkdir()
        made = subprocess.run([sys.executable, __file__, "--build", str(root)], env=child_env(root), cwd=root / "cwd",
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600)
        if made.returncode != 0:
            print(f"building the inputs failed:\n{made.stderr[-3000:]}", file=sys.stderr)
            return 2
        chosen = [c for c in cases(root) if args.only in c.name]
        print(f"{'case':42} | exit | seconds | peak MB | {'last line':58} | verdict", flush=True)
        failed = 0
        for i, case in enumerate(chosen):
            got = run_case(case, root, root / "logs" / str(i))
            failed += bool(got.problems)
            verdict = "FAIL: " + "; ".join(got.problems) if got.problems else "pass"
            last = got.last if len(got.last) <= 58 else got.last[:55] + "..."
            print(f"{case.name:42} | {got.code!s:>4} | {got.seconds:7.1f} | {got.peak_mb:7.0f} | {last:58} | {verdict}",
                  flush=True)
        print("\nexit 0 is the documented answer of:")
        for case in chosen:
            if case.ok:
                print(f"  {case.name}: {case.ok}")
        own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"\n{len(chosen) - failed} of {len(chosen)} cases pass, {failed} fail (each peak includes up to "
              f"{own:.0f} MB of this script's own, counted into its children through vfork)")
        return 1 if failed else 0
    finally:
        if args.keep:
            print(f"inputs kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
