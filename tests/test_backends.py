"""config/backends.py: one registry style for schedulers, launchers, combiners and models: built-ins by import
path, installed packages' entry points beside them (never in their place), an unknown name listing the known."""

from __future__ import annotations

import json
from importlib.metadata import EntryPoint, EntryPoints

import pytest

from hpctrain.config import backends
from hpctrain.config.backends import COMBINERS, LAUNCHERS, SCHEDULERS, Registry
from hpctrain.config.catalog import MODELS
from hpctrain.errors import ConfigError


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch) -> None:
    points = EntryPoints([
        EntryPoint("b", "json:loads", "hpctrain.things"), EntryPoint("a", "json:load", "hpctrain.things"),
        EntryPoint("broken", "hpctrain_no_such_module:X", "hpctrain.things"), EntryPoint("z", "json:dumps", "other")])
    monkeypatch.setattr(backends, "_installed", lambda: points)


def test_builtins_and_entry_points_by_name(installed: None) -> None:
    things = Registry("thing", "hpctrain.things", {"a": "json:dumps", "c": json}, key="thing")
    assert list(things) == ["a", "b", "broken", "c"] and len(things) == 4
    assert things.load("a") is json.dumps  # an installed package cannot replace a built-in
    assert things["b"] is json.loads and things.load("c") is json  # an object is its own target
    assert "b" in things and "z" not in things and things.get("z") is None
    with pytest.raises(ConfigError, match="no thing named 'z'") as info:
        things.load("z")
    assert "known: a, b, broken, c" in str(info.value)
    with pytest.raises(ValueError, match="no thing named 'z'; known: a, b, broken, c"):
        things.check("z")
    with pytest.raises(ConfigError, match=r"thing 'broken' \(hpctrain_no_such_module:X\) cannot be loaded"):
        things.load("broken")


def test_the_shipped_registries() -> None:
    assert list(SCHEDULERS) == ["cobalt", "local", "pbs", "slurm"]
    assert list(LAUNCHERS) == ["aprun", "local", "mpiexec-hydra", "mpiexec-pals", "srun"]
    assert list(COMBINERS) == ["adacomp", "adasum", "dasgd", "mean"]
    assert list(MODELS) == ["ffn", "lstm", "resnet"]
    assert all(callable(LAUNCHERS[name]) for name in LAUNCHERS)
