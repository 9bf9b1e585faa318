"""Everything hpctrain finds by name (scheduler back-ends, launchers, gradient combiners, models) is found through
one kind of registry: the built-ins listed by import path, plus the entry points any installed package declares in
the registry's group, so a site can ship a back-end hpctrain does not know (``[project.entry-points.
"hpctrain.schedulers"] oursched = "site_sched.backend:SCHEDULER"``), and the folders of site profiles such a package
ships (group ``hpctrain.sites``). Nothing is imported until it is asked for.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from functools import cache
from importlib.metadata import EntryPoints, entry_points
from typing import Any

from hpctrain.errors import ConfigError


@cache
def _installed() -> EntryPoints:
    """Every installed package's entry points, read once per process (reading them scans every distribution)."""
    return entry_points()


class Registry(Mapping[str, Any]):
    """Names of one kind of plug-in and the ``module:attribute`` each names (a built-in may be the object itself);
    ``load`` (or ``registry[name]``) imports on first use. Iterating gives the known names, sorted."""

    def __init__(self, what: str, group: str, builtin: Mapping[str, Any], *, key: str) -> None:
        self.what, self.group, self.key = what, group, key
        self.builtin = dict(builtin)
        self.loaded: dict[str, Any] = {}

    def _entry_points(self) -> dict[str, str]:
        return {ep.name: ep.value for ep in _installed().select(group=self.group)}

    def targets(self) -> dict[str, Any]:
        """Every known name and its ``module:attribute`` (an installed package's entry point cannot replace a
        built-in of the same name)."""
        return {**self._entry_points(), **self.builtin}

    def names(self) -> list[str]:
        """The known names, sorted."""
        return sorted(set(self.targets()) | set(self.loaded))

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and (name in self.loaded or name in self.targets())

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())

    def __getitem__(self, name: str) -> Any:
        if name not in self:
            raise KeyError(name)
        return self.load(name)

    def load(self, name: str) -> Any:
        """The plug-in called ``name``; a ConfigError listing the known names when there is none."""
        if name in self.loaded:
            return self.loaded[name]
        target = self.targets().get(name)
        if target is None:
            raise self.unknown(name)
        if not isinstance(target, str):
            return target
        module_name, _, attribute = target.partition(":")
        try:
            found = getattr(importlib.import_module(module_name), attribute) if attribute else \
                importlib.import_module(module_name)
        except (ImportError, AttributeError) as exc:
            raise ConfigError(f"{self.what} {name!r} ({target}) cannot be loaded: {exc}", key=self.key,
                              hint="check that the package that provides it is installed here") from None
        self.loaded[name] = found
        return found

    def unknown(self, name: str) -> ConfigError:
        """The error for a name nothing provides."""
        return ConfigError(f"no {self.what} named {name!r}", key=self.key, hint="known: " + ", ".join(self.names()))

    def check(self, name: str) -> str:
        """``name`` when it is known; a ValueError listing the known names (for a pydantic validator)."""
        if name not in self:
            raise ValueError(f"no {self.what} named {name!r}; known: {', '.join(self.names())}")
        return name


# The combiners' cost models are in planning/model.py: the planner refuses one it has none for.
COMBINERS = Registry("gradient combiner", "hpctrain.combiners", {
    "mean": "hpctrain.runtime.combiners.mean:MeanCombiner",
    "adasum": "hpctrain.runtime.combiners.adasum:AdasumCombiner",
    "adacomp": "hpctrain.runtime.combiners.adacomp:AdaCompCombiner",
    "dasgd": "hpctrain.runtime.combiners.dasgd:DaSGDCombiner",
}, key="train.combiner.name")
LAUNCHERS = Registry("launcher", "hpctrain.launchers", {
    name: f"hpctrain.submission.launchers:{backend}" for name, backend in (
        ("srun", "SRUN"), ("aprun", "APRUN"), ("mpiexec-pals", "MPIEXEC_PALS"), ("mpiexec-hydra", "MPIEXEC_HYDRA"),
        ("local", "LOCAL"))}, key="launcher")
SCHEDULERS = Registry("scheduler back-end", "hpctrain.schedulers", {
    name: f"hpctrain.submission.schedulers.{name}:SCHEDULER" for name in ("cobalt", "local", "pbs", "slurm")},
    key="scheduler")
# Folders of site profiles an installed package ships (``site_sched:SITE_CONFIGS``): searched after hpctrain's.
SITE_FOLDERS = Registry("site profile folder", "hpctrain.sites", {}, key="site")
