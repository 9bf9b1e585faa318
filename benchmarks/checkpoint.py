"""CheckpointStore save/load time against plain torch.save/torch.load of the same state, in one run.

Two states: the FFN (depth 9, 32 features: ~0.47 M params) with its Adam state, and ~100 MB of tensors.
Runs are interleaved and the median reported. The asynchronous save (what ``hpctrain run`` uses) is reported
twice: ``blocking`` is what the training loop waits for (the copy to CPU memory, then the commit once the
background write is done), ``total`` is from the call until the checkpoint is committed.
Usage: ``python benchmarks/checkpoint.py [--repeats N] [--dir D]``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from hpctrain.checkpoint.rng import capture_rng_state
from hpctrain.checkpoint.store import CheckpointStore
from hpctrain.ffn.model import ConvStack3D


def ffn_state() -> dict[str, Any]:
    torch.manual_seed(0)
    model = ConvStack3D(depth=9, features=32)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    opt.step()
    return {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": 1200, "data_position": 4800}


def big_state() -> dict[str, Any]:
    torch.manual_seed(0)
    return {"model": {f"layer{i}.weight": torch.randn(2_621_440) for i in range(10)}, "step": 1200}


def n_params(state: dict[str, Any]) -> int:
    return sum(t.numel() for t in state["model"].values())


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def measure(cases: dict[str, Callable[[], Any]], repeats: int) -> dict[str, float]:
    times: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(repeats):
        for name, fn in cases.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {k: statistics.median(v) * 1000 for k, v in times.items()}


def bench(label: str, state: dict[str, Any], root: Path, repeats: int) -> list[tuple[str, str, float, float]]:
    per_rank = {"rng": capture_rng_state(), "data_position": 37}
    plain = root / f"{label}-plain.pt"
    sha = CheckpointStore(root / f"{label}-sha256", keep=2)
    blake = CheckpointStore(root / f"{label}-blake2b", keep=2, checksum="blake2b")
    counter = iter(range(1, 10**6))

    def plain_save() -> None:
        torch.save(state, plain)

    def plain_save_fsync() -> None:
        torch.save(state, plain)
        fsync_file(plain)

    async_store = CheckpointStore(root / f"{label}-async", keep=2)
    blocking: list[float] = []

    def async_save() -> None:
        t0 = time.perf_counter()
        pending = async_store.save_async(next(counter), state, per_rank=per_rank)
        t1 = time.perf_counter()
        pending.wait()  # the training loop runs steps here; it commits at the boundary after the write ended
        t2 = time.perf_counter()
        async_store.commit(pending)
        blocking.append(t1 - t0 + time.perf_counter() - t2)

    saves = measure(
        {
            "torch.save": plain_save,
            "torch.save + fsync": plain_save_fsync,
            "store.save sha256": lambda: sha.save(next(counter), state, per_rank=per_rank),
            "store.save blake2b": lambda: blake.save(next(counter), state, per_rank=per_rank),
            "store.save_async sha256: total": async_save,
        },
        repeats,
    )
    saves["store.save_async sha256: blocking (training waits)"] = statistics.median(blocking) * 1000
    ckpt = sha.latest_valid()
    assert ckpt is not None
    loads = measure(
        {
            "torch.load": lambda: torch.load(plain, weights_only=True),
            "store.load": lambda: sha.load(ckpt),
            "store.latest_valid(verify=False)": lambda: sha.latest_valid(verify=False),
            "store.latest_valid(verify=True)": lambda: sha.latest_valid(verify=True),
        },
        repeats,
    )
    base_s, base_l = saves["torch.save"], loads["torch.load"]
    rows = [(label, k, v, v / base_s) for k, v in saves.items()]
    rows += [(label, k, v, v / base_l) for k, v in loads.items()]
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--dir", type=Path, default=None, help="where to write (default: a temp dir)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    root = Path(tempfile.mkdtemp(prefix="ckpt-bench-", dir=args.dir))
    try:
        rows: list[tuple[str, str, float, float]] = []
        for label, state in (("ffn", ffn_state()), ("100MB", big_state())):
            torch.save(state, root / "size.pt")
            size = (root / "size.pt").stat().st_size
            label = f"{label} ({n_params(state) / 1e6:.2f} M params, {size / 2**20:.1f} MiB)"
            rows += bench(label, state, root, args.repeats)
        print("| state | operation | median ms | ratio to plain torch.save / torch.load |\n|---|---|---:|---:|")
        for label, op, ms, ratio in rows:
            print(f"| {label} | {op} | {ms:.1f} | {ratio:.2f}x |")
        print(f"\n{args.repeats} interleaved repeats, median; {os.cpu_count()} CPUs; files in {root.parent}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
