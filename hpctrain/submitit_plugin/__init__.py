"""hpctrain as a submitit executor: ``submitit.AutoExecutor(folder, cluster="hpctrain", hpctrain_site=...)``.

The laptop side (executor.py, job.py, watcher.py, params.py, probe.py, fetch.py) submits pickled callables
through hpctrain's one stage-and-submit path; the job side (runner.py) is torch-free and submitit-free.
Nothing is imported here: the job side imports ``runner`` without pulling in submitit.
"""
