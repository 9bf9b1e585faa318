"""hpctrain's measuring instruments, kept beside the package and out of its wheel: the MPI/socket interposer
(``wire_counts``), per-rank syscall tracing (``syscall_trace``), K ranks simulated in one process (``simulate``),
the published scaling studies and the Theta fit the planner is checked against (``published``, ``ffn_theta``),
the FFN's size and FLOPs by formula (``ffn_counts``) and checks of its CPU speed settings (``ffn_perf_checks``).
Benchmarks and tests import it from the repository root.
"""
