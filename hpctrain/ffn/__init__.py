"""The Flood-Filling Network (google/ffn) in PyTorch, in three parts and what they share.

``training`` (coordinates, shards, FOV-movement examples and loss, the training task), ``inference`` (settings,
seeds, the canvas, agglomeration, subvolumes, tuning) and ``evaluation`` (VOI, baselines); beside them the
modules both use: ``model`` (ConvStack3D), ``volume`` (lazy HDF5/zarr), ``synthetic`` (EM-like test volumes),
``perf``, ``movement`` and ``segmentation``. Import the submodules directly; this package imports
nothing heavy.
"""
