"""Communication between the ranks: the Communicator contract (``base``), its back-ends (``mpi``, ``torch_dist``,
chosen by name in ``backends``), how ranks meet (``rendezvous``, ``exchange_store``), the point-to-point
all-reduce and all-gather, and the watchdog that names a rank that never arrives.
"""
