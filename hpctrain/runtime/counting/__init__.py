"""What a rank counts about itself when counting is on: opens and imports (``counters``), collectives
(``comm_counts``), store requests (``store_counts``), work per step (``work_counts``), busy time per rank
(``rank_times``) and, when a benchmark preloads the MPI interposer, its counts (``wire``).
"""
