"""The Flood-Filling Network (google/ffn) in PyTorch: model, synthetic data, volumes, examples, training.

Modules: ``model`` (ConvStack3D), ``synthetic`` (EM-like test volumes), ``volume`` (lazy HDF5/zarr),
``examples`` (partitions, coordinates, shards), ``training`` (FOV-movement batches, loss, clipping),
``inference`` and evaluation. Import the submodules directly; this package imports nothing heavy.
"""
