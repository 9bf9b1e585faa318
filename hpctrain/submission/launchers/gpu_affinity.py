"""Give each local rank its devices: ``python -m hpctrain.submission.launchers.gpu_affinity --kind nvidia
--devices 3:2:1:0 -- CMD...`` (local rank r gets the r-th ``:``-separated entry; ``,`` separates a rank's devices).

Launchers without GPU binding (PALS mpiexec, hydra) start every rank seeing every device; this wrapper reads
the local rank, sets CUDA_VISIBLE_DEVICES / ROCR_VISIBLE_DEVICES / ZE_AFFINITY_MASK and execs CMD. The map comes
from the site's topology (``node.gpu_order``: Polaris gives rank 0, on cores 0-7, GPU 3); ``--gpus-per-rank N``
instead gives rank r the devices r*N .. r*N+N-1.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping

from hpctrain.job_environment import rank_variables

# Intel's variable takes device ids as the driver enumerates them: in FLAT mode (ALCF's frameworks module) one per
# tile, 0-11 on an Aurora node, so tile t of GPU g is device 2g + t.
VISIBLE_VARIABLE = {"nvidia": "CUDA_VISIBLE_DEVICES", "amd": "ROCR_VISIBLE_DEVICES", "intel": "ZE_AFFINITY_MASK"}


def local_rank_variables(env: Mapping[str, str]) -> list[str]:
    """The local-rank variables to read, from the job environments (job_environment.py): the launcher whose marker
    is set first, then every launcher's in precedence order."""
    rows = rank_variables(env)
    started = [row for row in rows if row.marker in env][:1]
    return list(dict.fromkeys(name for row in [*started, *rows] for name in row.local_rank))


def local_rank(env: Mapping[str, str]) -> int:
    """This process's rank on its node, from the first launcher variable present (0 when none is)."""
    for name in local_rank_variables(env):
        value = env.get(name, "").strip()
        if value.isdigit():
            return int(value)
    return 0


def _variable(kind: str) -> str:
    if kind not in VISIBLE_VARIABLE:
        raise ValueError(f"unknown GPU kind {kind!r}; expected one of {', '.join(VISIBLE_VARIABLE)}")
    return VISIBLE_VARIABLE[kind]


def visible_devices(kind: str, rank: int, gpus_per_rank: int) -> tuple[str, str]:
    """(variable, value) giving local rank ``rank`` its ``gpus_per_rank`` consecutive devices."""
    first = rank * gpus_per_rank
    return _variable(kind), ",".join(str(first + i) for i in range(gpus_per_rank))


def mapped_devices(kind: str, rank: int, devices: str) -> tuple[str, str]:
    """(variable, value) giving local rank ``rank`` its entry of the ``--devices`` map (``3:2:1:0``)."""
    from hpctrain.submission.launchers.binding import parse_id_sets

    entries = parse_id_sets(devices)
    if rank >= len(entries):
        raise ValueError(f"local rank {rank} has no devices in the map {devices!r} ({len(entries)} ranks per node "
                         "planned): the launcher started more ranks per node than the script was written for")
    return _variable(kind), ",".join(str(d) for d in entries[rank])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hpctrain.submission.launchers.gpu_affinity", description=__doc__)
    parser.add_argument("--kind", required=True, choices=sorted(VISIBLE_VARIABLE))
    chosen = parser.add_mutually_exclusive_group()
    chosen.add_argument("--devices", default=None, metavar="MAP", help="each local rank's devices: 3:2:1:0, 0,1:2,3")
    chosen.add_argument("--gpus-per-rank", type=int, default=1)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given after --")
    rank = local_rank(os.environ)
    try:
        name, value = (mapped_devices(args.kind, rank, args.devices) if args.devices is not None
                       else visible_devices(args.kind, rank, args.gpus_per_rank))
    except ValueError as exc:
        print(f"hpctrain.submission.launchers.gpu_affinity: {exc}", file=sys.stderr)
        return 2
    os.environ[name] = value
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        print(f"hpctrain.submission.launchers.gpu_affinity: cannot run {command[0]!r}: {exc}", file=sys.stderr)
        return 127
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
