"""``hpctrain plan`` inputs: no ``--set`` value, node count, target or site file ends in a traceback; each bad
value is one line naming the parameter and its rule; a site without ``network:`` says what the plan assumes;
the hint for a missing measurement is a command line that works.

Runs the real command in this process (``hpctrain.cli.main``), so an uncaught exception fails the test.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpctrain.cli import main
from hpctrain.planning.parameters import SPECS

REPO = Path(__file__).resolve().parent.parent
JOB = str(REPO / "jobs" / "ffn-theta.yaml")
MEASURED = ["--set", "compute_s=1.43", "--set", "compute_std_s=0.03", "--set", "grad_bytes=2.5e6"]
NUMBERS = (0, -1, -0.0, math.nan, math.inf, -math.inf, 1e308, 1e18, 5e-324, 1e-7, 1, 2.5, 2**63, "x", "", "1e999")
HOSTILE = st.one_of(st.sampled_from(NUMBERS), st.floats(allow_nan=True, allow_infinity=True),
                    st.integers(min_value=-(2**70), max_value=2**70), st.text(max_size=8))


def run_plan(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["plan", JOB, "--site", "theta", "--json", *args])
    out, err = capsys.readouterr()
    return code, out, err


def assert_clean(code: int, err: str) -> None:
    assert "Traceback" not in err
    if code != 0:
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and lines[0].startswith("hpctrain: error: "), err


@pytest.mark.slow
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(sorted(SPECS)), value=HOSTILE, nodes=st.sampled_from(["1", "2,64", "4392"]))
def test_no_set_value_ends_in_a_traceback(capsys: pytest.CaptureFixture[str], name: str, value: object,
                                          nodes: str) -> None:
    code, out, err = run_plan(capsys, *MEASURED, "--set", f"{name}={value}", "--nodes", nodes)
    assert_clean(code, err)
    if code == 0:
        assert "NaN" not in out  # every printed number is a number (an impossible time is null)
    else:
        assert name in err


@pytest.mark.parametrize("name", sorted(n for n, s in SPECS.items() if not isinstance(s.kind, tuple)
                                        and s.kind is not bool))
@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "1e308"])
def test_every_numeric_parameter_has_a_range(capsys: pytest.CaptureFixture[str], name: str, value: str) -> None:
    code, _, err = run_plan(capsys, *MEASURED, "--set", f"{name}={value}", "--nodes", "1,2,64")
    assert_clean(code, err)
    spec = SPECS[name]
    if value in ("-1", "nan", "inf", "1e308") or (value == "0" and spec.positive):
        assert code == 2 and f"{name}: " in err  # one line naming the parameter and its rule


@pytest.mark.processes
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(nodes=st.one_of(st.integers(min_value=-(2**64), max_value=2**64).map(str), st.text(max_size=6)),
       target=st.sampled_from(["--samples", "--steps"]), amount=st.sampled_from(["nan", "-1", "0", "inf", "1e300"]))
def test_no_node_count_or_target_ends_in_a_traceback(capsys: pytest.CaptureFixture[str], nodes: str, target: str,
                                                     amount: str) -> None:
    code, _, err = run_plan(capsys, *MEASURED, f"--nodes={nodes}", f"{target}={amount}")
    assert_clean(code, err)
    assert code == 2  # each of these targets is refused (or the node count is)


@pytest.mark.parametrize("setting", ["bucket_mb=1e-7", "bucket_mb=5e-324", "grad_bytes=1e18",
                                     "ranks_per_node=1e308", "compute_std_s=1e300", "metadata_ops_per_s=0",
                                     "nic_gbps=0", "ranks_per_node=0", "compute_s=0"])
def test_the_reported_values_are_refused_with_their_rule(capsys: pytest.CaptureFixture[str], setting: str) -> None:
    code, _, err = run_plan(capsys, *MEASURED, "--set", setting)
    assert_clean(code, err)
    assert code == 2 and setting.partition("=")[0] in err


def test_a_tiny_bucket_is_refused_before_the_layout_is_built(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_plan(capsys, *MEASURED, "--set", "bucket_mb=0.001", "--set", "grad_bytes=1e12")
    assert code == 2 and "buckets; the planner costs at most 100000" in err


@pytest.mark.parametrize("line", ["latency_us: .inf", "latency_us: .nan", "nic_gbps: 1e400", "nodes: 100000000000",
                                  "taper: 0", "taper_nodes: -1", "reduce_gbps: 0"])
def theta_with_network(tmp_path: Path, line: str | None) -> Path:
    """The Theta profile with one ``network:`` figure replaced or added (``line``), or with no network at all."""
    lines = (REPO / "hpctrain" / "site_configs" / "theta.yaml").read_text().splitlines()
    start = lines.index("network:")
    end = next((i for i in range(start + 1, len(lines)) if lines[i] and not lines[i].startswith(" ")), len(lines))
    block = lines[start + 1:end]
    if line is None:
        lines = lines[:start] + lines[end:]
    else:
        key = line.partition(":")[0]
        block = [b for b in block if not b.strip().startswith(key + ":")] + ["  " + line]
        lines = lines[:start + 1] + block + lines[end:]
    site = tmp_path / "odd.yaml"
    site.write_text("\n".join(lines) + "\n")
    return site


@pytest.mark.parametrize("line", ["latency_us: .inf", "latency_us: .nan", "nic_gbps: 1e400", "nodes: 100000000000",
                                  "taper: 0", "taper_nodes: -1", "reduce_gbps: 0", "intra_latency_us: 1e300"])
def test_no_site_file_ends_in_a_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str], line: str) -> None:
    site = theta_with_network(tmp_path, line)
    code = main(["plan", JOB, "--site", str(site), "--json", *MEASURED, "--nodes", "2"])
    _, err = capsys.readouterr()
    assert_clean(code, err)
    assert code == 2, err  # every one of these is out of range
    assert line.partition(":")[0] in err


def test_a_site_without_network_says_what_is_assumed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    site = theta_with_network(tmp_path, None)
    code = main(["plan", JOB, "--site", str(site), *MEASURED, "--nodes", "1,2"])
    _, err = capsys.readouterr()
    assert code == 0, err
    assert "has no network: section; the plan assumes" in err and "nic_gbps=12.5 GB/s" in err


def test_the_missing_measurement_hint_is_a_working_command(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_plan(capsys)
    assert code == 2
    hint = err.partition("; give --from RUN (a run of this job), or --calibrate, or ")[2].strip()
    assert hint.startswith("--set compute_s=VALUE --set"), err
    sets = hint.replace("VALUE", "1").split()
    code, out, err = run_plan(capsys, *sets)
    assert code == 0, err and out


def test_start_up_follows_the_jobs_staging_mode(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_plan(capsys, *MEASURED, "--nodes", "64", "--set", "staging.environment=archive")
    assert code == 0, err
    staged = json.loads(out)
    assert staged["parameters"]["startup_staged"]["value"] is True
    assert staged["parameters"]["startup_staged"]["source"] == "job"
    code, out, err = run_plan(capsys, *MEASURED, "--nodes", "64")
    shared = json.loads(out)
    assert shared["parameters"]["startup_staged"]["value"] is False
    # every rank opening the environment on the shared file system costs more than one staged copy
    assert shared["predictions"][0]["startup_s"] > staged["predictions"][0]["startup_s"]
