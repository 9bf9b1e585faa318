"""Segmenting a volume with a trained FFN: settings and model package (``settings``), seeds, the flood-filling
canvas and its FOV batching, agglomeration and learned joins, the stages run from a checkpoint (``runner``),
subvolumes of a large volume, and thresholds tuned per model (``tuning``). Imports nothing from ``training``."""
