"""Every timeout of a communicator, derived from the one setting ``train.collective_timeout_s``."""

from __future__ import annotations

from dataclasses import dataclass

# Start-up skew between ranks (imports from a shared file system, MPI_Init) is not a collective's lateness: a
# loaded node or a cold file-system cache makes one rank minutes late (torchrun waits 600 s for its rendezvous).
RENDEZVOUS_MIN_S = 300.0
PROCESS_GROUP_MARGIN_S = 60.0  # past the watchdog's deadline: its tick + grace (<= 11 s) + the abort itself


@dataclass(frozen=True)
class Timeouts:
    """Every timeout of a communicator, all from the one setting ``train.collective_timeout_s`` (docs/runtime.md).

    ``collective_s``: hpctrain's watchdog, which names the ranks behind and aborts. ``rendezvous_s``: start-up,
    the MPI broadcast of rank 0's address and the TCPStore's connect and wait (every rank must have joined).
    ``store_s``: the TCPStore's operations, never shorter than a collective. ``process_group_s``: the back-end's
    own collective timeout, later than the watchdog by its tick and grace, so the message that names a rank
    is always the one the job ends with.
    """

    collective_s: float
    rendezvous_s: float
    store_s: float
    process_group_s: float

    @classmethod
    def from_setting(cls, collective_timeout_s: float) -> Timeouts:
        t = float(collective_timeout_s)
        rendezvous = max(t, RENDEZVOUS_MIN_S)
        return cls(collective_s=t, rendezvous_s=rendezvous, store_s=rendezvous,
                   process_group_s=t + PROCESS_GROUP_MARGIN_S)
