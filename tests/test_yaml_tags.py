"""Explicit YAML tags on values they do not fit (``!!float 'x'``, ``!!bool 'x'``, ``!!timestamp 'x'``): one
ConfigError naming the file, in a file or a ``--set`` flag — never the constructor's own exception."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpctrain.config.job import load_job
from hpctrain.config.yamlio import parse_yaml
from hpctrain.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
JOB = REPO / "hpctrain" / "jobs" / "resnet-local.yaml"
TAGS = ["!!int", "!!float", "!!bool", "!!timestamp", "!!binary", "!!null", "!!str", "!!set", "!!omap", "!!pairs",
        "!!seq", "!!map", "!!merge", "!!value"]


@given(tag=st.sampled_from(TAGS), text=st.text(max_size=40))
def test_any_tagged_scalar_is_a_value_or_one_config_error(tag: str, text: str) -> None:
    try:
        parse_yaml(f"key: {tag} {json.dumps(text)}\n", "t.yaml")
    except ConfigError as exc:
        assert str(exc).startswith("t.yaml") and exc.path == "t.yaml"


@pytest.mark.parametrize("value", ["!!float 'x'", "!!int 'x'", "!!bool 'x'", "!!timestamp 'x'",
                                   "!!timestamp 2001-13-45", "!!int", "!!float ''"])
def test_a_tag_the_value_does_not_fit_names_the_file_and_the_tag(tmp_path: Path, value: str) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text(JOB.read_text().replace("lr: 0.05", f"lr: {value}"))
    with pytest.raises(ConfigError) as info:
        load_job(spec)
    assert info.value.path == str(spec) and "does not fit its YAML tag" in str(info.value)
    with pytest.raises(ConfigError) as info:
        load_job(JOB, sets=[f"train.lr={value}"])
    assert info.value.path == "--set train.lr=" + value and info.value.key == "train.lr"


@pytest.mark.processes
def test_a_misfit_tag_on_the_command_line_is_one_line() -> None:
    done = subprocess.run([sys.executable, "-m", "hpctrain", "render", str(JOB), "--set", "train.lr=!!float x"],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [done.stderr.strip()] and "YAML tag" in done.stderr
