"""The laptop / login-node side: render batch scripts, submit, track, cancel and resume runs.

Nothing in this package imports torch, numpy or mpi4py: ``hpctrain render/submit/status`` must start in a
fraction of a second. The launchers' in-job helpers (``launchers.local_launch``, ``launchers.gpu_affinity``)
run inside the allocation but are plain Python too.
"""
