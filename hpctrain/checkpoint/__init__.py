"""Atomic checkpoints with a manifest (store), RNG capture (rng) and the preemption flag (signals).

Import the submodules directly; ``signals`` does not import torch, ``store`` and ``rng`` do.
"""
