"""hpctrain: take a data-parallel training job from a laptop to thousands of supercomputer nodes.

Importing this package is cheap (no torch, numpy or mpi4py): the CLI's submission path depends on it.
"""

__version__ = "0.1.0"
