"""Give each local rank its GPUs: ``python -m hpctrain.submission.launchers.gpu_affinity --kind nvidia
--gpus-per-rank 1 -- CMD...``.

Launchers without GPU binding (PALS mpiexec, hydra) start every rank seeing every GPU; this wrapper reads
the local rank, sets CUDA_VISIBLE_DEVICES / ROCR_VISIBLE_DEVICES / ZE_AFFINITY_MASK and execs CMD.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping

# Local-rank variables, first present wins (PALS under PBS, hydra, Slurm, Open MPI, ALPS, torchrun).
LOCAL_RANK_VARIABLES = ("PALS_LOCAL_RANKID", "MPI_LOCALRANKID", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK",
                        "PMI_LOCAL_RANK", "ALPS_APP_PE_LOCAL", "LOCAL_RANK")
VISIBLE_VARIABLE = {"nvidia": "CUDA_VISIBLE_DEVICES", "amd": "ROCR_VISIBLE_DEVICES", "intel": "ZE_AFFINITY_MASK"}


def local_rank(env: Mapping[str, str]) -> int:
    """This process's rank on its node, from the first launcher variable present (0 when none is)."""
    for name in LOCAL_RANK_VARIABLES:
        value = env.get(name, "").strip()
        if value.isdigit():
            return int(value)
    return 0


def visible_devices(kind: str, rank: int, gpus_per_rank: int) -> tuple[str, str]:
    """(variable, value) giving local rank ``rank`` its ``gpus_per_rank`` consecutive devices."""
    if kind not in VISIBLE_VARIABLE:
        raise ValueError(f"unknown GPU kind {kind!r}; expected one of {', '.join(VISIBLE_VARIABLE)}")
    first = rank * gpus_per_rank
    return VISIBLE_VARIABLE[kind], ",".join(str(first + i) for i in range(gpus_per_rank))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hpctrain.submission.launchers.gpu_affinity", description=__doc__)
    parser.add_argument("--kind", required=True, choices=sorted(VISIBLE_VARIABLE))
    parser.add_argument("--gpus-per-rank", type=int, default=1)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given after --")
    name, value = visible_devices(args.kind, local_rank(os.environ), args.gpus_per_rank)
    os.environ[name] = value
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        print(f"hpctrain.submission.launchers.gpu_affinity: cannot run {command[0]!r}: {exc}", file=sys.stderr)
        return 127
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
