"""Training the FFN on the ranks: balanced training coordinates (``coordinates``) and each rank's share of them
(``shards``), volumes read once per node (``node_volume``), FOV-movement examples (``moves``, ``stream``), the
loss and metrics (``loss``), and the runtime's training task (``task``). Imports nothing from ``inference``."""
