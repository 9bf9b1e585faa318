"""The scaling planner behind ``hpctrain plan``: predicted step time and efficiency of a job at N nodes.

Laptop side and plain Python: ``model`` turns plain numbers (``parameters``) into per-N predictions;
``inputs`` gathers those numbers from a job, a site profile and a run's measured profile.
"""
