"""MPI calls and the messages they send, measured where they leave the process (``wire/wire_count.c``).

``build(directory)`` compiles the interposer with the MPI library's ``mpicc``: a wrapper for every function in its
``mpi_proto.h`` (each counts the call and forwards it to ``PMPI_<name>``) and counters on the send and receive
calls of TCP sockets. ``environment(library)`` is what a launcher passes to the ranks to measure: the library in
``LD_PRELOAD`` and ``MPIR_CVAR_NOLOCAL=1`` (MPICH sends to ranks of the same node through its network module
instead of shared memory, so every message crosses a socket; what a rank sends is then what it would send with
every rank on its own node). Without it nothing is loaded and nothing is counted. A rank reads its own counts
with ``hpctrain.runtime.counting.wire.snapshot()``; ``received_messages(...)`` finds, across the ranks'
snapshots, who is at the other end of each connection, so that messages received are the messages the peers sent.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from hpctrain.files import atomic_path
from hpctrain.runtime.counting.wire import CONNECTION_FIELDS, ENV_LIBRARY

SOURCE = Path(__file__).with_name("wire") / "wire_count.c"
LIBRARY_NAME = "libhpctrain_wire.so"
# Not wrapped: functions with a variable argument list (MPI_Pcontrol, a no-op), which a generated wrapper cannot
# forward, and the ABI queries mpi4py looks up in the process before it loads any MPI library (a wrapper found
# then would have no library to forward to).
SKIPPED = ("MPI_Pcontrol", "MPI_Abi_")
_PROTOTYPE = re.compile(r"^(\w+) (MPI_\w+)\(")
# MPI functions that move data or make and free communicators; the others ask questions (ranks, sizes, Iprobe,
# Test, extents) and send nothing themselves. Large-count variants end in _c.
COMMUNICATING = re.compile(r"^MPI_(I?(allreduce|bcast|allgatherv?|gatherv?|barrier|reduce|reduce_scatter(_block)?"
                           r"|scatterv?|alltoall[vw]?|scan|exscan)|I?sendrecv(_replace)?|I?[bsr]?send|I?recv"
                           r"|comm_(dup|idup|free|split|split_type|create))$", re.IGNORECASE)


def find_mpicc(prefix: str = sys.prefix) -> str:
    """The ``mpicc`` of this environment's MPI (the mpich wheel's ``bin/mpicc``), else the one on PATH."""
    here = Path(prefix) / "bin" / "mpicc"
    found = str(here) if here.is_file() else shutil.which("mpicc")
    if found is None:
        raise FileNotFoundError("no mpicc: install the mpich wheel (pip install mpich) or an MPI with its compiler")
    return found


def prototypes_file(mpicc: str) -> Path:
    """``mpi_proto.h`` (MPICH) beside the ``mpi.h`` that ``mpicc`` compiles against."""
    show = subprocess.run([mpicc, "-show"], capture_output=True, text=True, check=True).stdout.split()
    for flag in show:
        if flag.startswith("-I") and (Path(flag[2:]) / "mpi_proto.h").is_file():
            return Path(flag[2:]) / "mpi_proto.h"
    raise FileNotFoundError(f"{mpicc} -show names no include directory with mpi_proto.h (MPICH's)")


def _split_params(text: str) -> list[str]:
    depth, start, out = 0, 0, []
    for i, ch in enumerate(text):
        depth += ch in "([" and 1 or (-1 if ch in ")]" else 0)
        if ch == "," and depth == 0:
            out.append(text[start:i].strip())
            start = i + 1
    if text.strip():
        out.append(text[start:].strip())
    return out


def _param_name(param: str) -> str:
    if "(" in param:  # a function pointer: int (*fn)(int)
        return re.search(r"\(\s*\*\s*(\w+)\s*\)", param).group(1)  # type: ignore[union-attr]
    return re.findall(r"\w+", param.split("[", 1)[0])[-1]


def prototypes(header: str) -> list[tuple[str, str, str]]:
    """(return type, name, parameter list) of every ``MPI_`` function declared in ``header``'s text with its
    ``PMPI_`` twin."""
    out = []
    lines = header.splitlines()
    profiled = set(re.findall(r"^\w+ P(MPI_\w+)\(", header, re.MULTILINE))
    for i, line in enumerate(lines):
        m = _PROTOTYPE.match(line)
        if not m or m.group(2).startswith(SKIPPED) or m.group(2) not in profiled:
            continue
        text = "\n".join(lines[i:i + 8])
        start = text.index("(")
        depth = 0
        for j in range(start, len(text)):
            depth += {"(": 1, ")": -1}.get(text[j], 0)
            if depth == 0:
                break
        params = " ".join(text[start + 1:j].split())
        if "..." in params:
            continue
        out.append((m.group(1), m.group(2), "" if params == "void" else params))
    return out


def wrappers(protos: list[tuple[str, str, str]]) -> str:
    """C source of one counting wrapper per prototype, the names table and the read-out functions."""
    names = ",\n".join(f'    "{name}"' for _, name, _ in protos)
    parts = [f"#include <mpi.h>\n\n#define N_CALLS {len(protos)}\n",
             f"static const char *call_names[N_CALLS] = {{\n{names}\n}};\n",
             "static uint64_t call_counts[N_CALLS];\n",
             "uint64_t hpctrain_wire_n_calls(void) { return N_CALLS; }\n",
             "const char *hpctrain_wire_call_name(uint64_t i) { return i < N_CALLS ? call_names[i] : NULL; }\n",
             "void hpctrain_wire_calls(uint64_t *out) {\n"
             "    for (int i = 0; i < N_CALLS; i++) out[i] = __atomic_load_n(&call_counts[i], __ATOMIC_RELAXED);\n}\n"]
    for i, (ret, name, params) in enumerate(protos):
        args = ", ".join(_param_name(p) for p in _split_params(params))
        # The names in parentheses: mpi.h defines some of them as macros (MPI_Comm_c2f and the other handle
        # conversions), which a parenthesised name does not expand.
        parts.append(f"{ret} ({name})({params or 'void'}) {{\n"
                     f"    __atomic_fetch_add(&call_counts[{i}], 1, __ATOMIC_RELAXED);\n"
                     f"    return (P{name})({args});\n}}\n")
    return "\n".join(parts)


def build(directory: str | os.PathLike[str], mpicc: str | None = None) -> Path:
    """Compile the interposer into ``directory`` (reused while the source and the MPI headers are unchanged)."""
    mpicc = mpicc or find_mpicc()
    header = prototypes_file(mpicc)
    source = SOURCE.read_text(encoding="utf-8") + "\n" + wrappers(prototypes(header.read_text(encoding="utf-8")))
    key = hashlib.sha256((source + str(header)).encode()).hexdigest()[:16]
    out = Path(directory) / key / LIBRARY_NAME
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    c_file = out.with_suffix(".c")
    c_file.write_text(source, encoding="utf-8")
    # mpicc links libmpi (and its directory as the run path): preloaded, the library brings the MPI library with
    # it, and mpi4py, which looks for MPI in the process before it loads one, finds that one.
    with atomic_path(out) as tmp:
        done = subprocess.run([mpicc, "-shared", "-fPIC", "-O2", "-Wall", "-o", str(tmp), str(c_file), "-ldl"],
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{mpicc} could not build {c_file}:\n{done.stderr[-3000:]}")
    return out


def environment(library: str | os.PathLike[str], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Variables that make a launcher's ranks count: the library preloaded, MPICH's traffic through sockets."""
    env = os.environ if environ is None else environ
    preload = " ".join(p for p in (str(library), env.get("LD_PRELOAD", "")) if p)
    return {"LD_PRELOAD": preload, "MPIR_CVAR_NOLOCAL": "1", ENV_LIBRARY: str(library)}


def totals(counts: Mapping[str, Any]) -> dict[str, int]:
    """Summed over connections: send calls, messages and bytes sent, receive calls and bytes received; and
    ``mpi_calls`` (every MPI function)."""
    out = dict.fromkeys(("send_calls", "sent_messages", "sent_bytes", "recv_calls", "received_bytes"), 0)
    for c in counts["connections"]:
        for i, name in enumerate(CONNECTION_FIELDS[2:7], start=2):
            out[name] += c[i]
    out["mpi_calls"] = sum(counts["calls"].values())
    return out


def communication_calls(counts: Mapping[str, Any]) -> int:
    """Calls of ``COMMUNICATING`` functions in a snapshot or a difference of two."""
    return sum(n for name, n in counts["calls"].items() if COMMUNICATING.match(name.removesuffix("_c")))


def received_messages(per_rank: Iterable[Mapping[str, Any] | None]) -> list[int]:
    """Messages each rank received in the same window of every rank's counts: the messages its peers sent on
    the connections whose other end is this rank (one host: a connection is its pair of ports)."""
    ranks = list(per_rank)
    sent_to: dict[tuple[int, int], int] = {}
    for counts in ranks:
        for c in (counts or {}).get("connections", []):
            sent_to[(c[0], c[1])] = sent_to.get((c[0], c[1]), 0) + c[3]
    return [sum(sent_to.get((c[1], c[0]), 0) for c in (counts or {}).get("connections", [])) for counts in ranks]
