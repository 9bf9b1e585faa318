"""The one number reader: every numeric field of a job spec and a site profile, every flag, scheduler output and
submitit parameter either gives a bounded, finite number or one line naming the field — never a traceback."""

from __future__ import annotations

import math
import subprocess
import sys
import typing
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from hpctrain.config import numbers
from hpctrain.config.job import JobSpec, load_job
from hpctrain.config.site import SiteProfile, load_site_file
from hpctrain.errors import ConfigError, HpctrainError
from hpctrain.submission.discovery.detect import findings_from
from hpctrain.submission.discovery.probe import Probe, Section
from hpctrain.submission.discovery.profile import draft_profile
from hpctrain.submitit_plugin.params import build_job, check_values

REPO = Path(__file__).resolve().parents[1]
JOB = REPO / "hpctrain" / "jobs" / "resnet-local.yaml"

# Number-like text: huge integers, superscripts and other Unicode digits, floats at and past the limits.
NUMBER_TEXT = st.one_of(
    st.integers(min_value=-(10 ** 60), max_value=10 ** 60).map(str),
    st.integers(min_value=4000, max_value=6000).map(lambda n: "9" * n),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["²", "١٢", "1e308", "1e-7", "5e-324", "-0", ".inf", ".nan", "0x10", "1_000", "+3", "1e99999",
                     "0.001", "1048576", "1048577", "4.0"]),
    st.text(alphabet="0123456789.eE+-_²³¹", max_size=30),
)


def _numeric_fields(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Key paths of every int or float field reachable through nested models (not through dicts or lists)."""
    found: list[tuple[str, ...]] = []
    for name, field in model.model_fields.items():
        args = typing.get_args(field.annotation) or (field.annotation,)
        flat = [typing.get_args(a)[0] if typing.get_origin(a) is typing.Annotated else a for a in args]
        if any(a in (int, float) for a in flat):
            found.append((*prefix, name))
        for a in flat:
            if isinstance(a, type) and issubclass(a, BaseModel):
                found.extend(_numeric_fields(a, (*prefix, name)))
    return found


JOB_FIELDS = _numeric_fields(JobSpec)
SITE_FIELDS = [f for f in _numeric_fields(SiteProfile) if f[0] in ("node", "network")]


def test_the_field_walk_finds_the_numeric_fields() -> None:
    assert ("resources", "memory_gb") in JOB_FIELDS and ("train", "combiner", "bucket_mb") in JOB_FIELDS
    assert ("node", "memory_gb") in SITE_FIELDS and ("network", "metadata_ops_per_s") in SITE_FIELDS
    assert len(JOB_FIELDS) >= 25 and len(SITE_FIELDS) >= 15


def _assert_one_line_about(exc: ConfigError, field: str) -> None:
    """One line naming the key or, for a rule between keys (warmup steps or epochs), the mapping above it."""
    text = str(exc)
    assert "\n" not in text and (field in text or field.rpartition(".")[0] in text), text
    assert len(text) < 600 and "Traceback" not in text, text


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(field=st.sampled_from(JOB_FIELDS), text=NUMBER_TEXT)
def test_any_number_text_in_any_job_field_is_a_bounded_number_or_one_line(field: tuple[str, ...], text: str) -> None:
    dotted = ".".join(field)
    try:
        job = load_job(JOB, sets=[f"{dotted}={text}"])
    except ConfigError as exc:
        _assert_one_line_about(exc, dotted)
        return
    value: object = job
    for part in field:
        value = getattr(value, part)
    assert value is None or isinstance(value, (int, float, str))
    if isinstance(value, float):
        assert math.isfinite(value)
    if isinstance(value, int):
        assert abs(value) < 10 ** numbers.MAX_DIGITS
    if job.resources.memory_gb is not None:
        assert isinstance(job.resources.memory_mb, int)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(field=st.sampled_from(SITE_FIELDS), text=NUMBER_TEXT)
def test_any_number_text_in_any_site_field_is_a_bounded_number_or_one_line(tmp_path: Path, field: tuple[str, ...],
                                                                           text: str) -> None:
    nested = f"{field[0]}:\n  {field[1]}: {text}\n"
    path = tmp_path / "s.yaml"
    path.write_text(f"name: s\nextends: local\n{nested}")
    try:
        site = load_site_file(path)
    except ConfigError as exc:
        assert str(path) in str(exc) and "\n" not in str(exc)
        return
    value = getattr(getattr(site, field[0]), field[1])
    assert not isinstance(value, float) or math.isfinite(value)


@given(st.text(max_size=40))
def test_parse_int_and_float_take_ascii_digits_only(text: str) -> None:
    for parse in (numbers.parse_int, numbers.parse_float):
        try:
            value = parse(text, "f")
        except numbers.NumberError as exc:
            assert str(exc).startswith("f: ") and "\n" not in str(exc)
            continue
        assert math.isfinite(value) and text.strip().isascii()


@given(st.one_of(st.text(max_size=30), st.integers().map(str), st.none()))
def test_plain_count_never_raises(text: str | None) -> None:
    value = numbers.plain_count(text)
    assert value is None or (isinstance(value, int) and 0 <= value <= 10 ** 15)


@given(st.one_of(st.floats(), st.integers(min_value=-(10 ** 200), max_value=10 ** 200), st.none(), st.booleans()))
def test_check_number_refuses_what_is_not_a_finite_number(value: object) -> None:
    try:
        got = numbers.check_number(value, "mem_gb", numbers.Bounds(0, 1e6))
    except numbers.NumberError as exc:
        assert str(exc).startswith("mem_gb: ")
        return
    assert isinstance(got, (int, float)) and not isinstance(got, bool) and 0 <= got <= 1e6


def test_bucket_and_memory_bounds() -> None:
    with pytest.raises(ConfigError, match="bucket_mb"):
        load_job(JOB, sets=["train.combiner.bucket_mb=1e-7"])
    with pytest.raises(ConfigError, match="memory_gb"):
        load_job(JOB, sets=["resources.memory_gb=1e308"])
    assert load_job(JOB, sets=["train.combiner.bucket_mb=0.001"]).train.combiner.bucket_mb == 0.001


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hpctrain", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=120)


@pytest.mark.processes
@pytest.mark.parametrize("args", [
    ["--nodes", "²"], ["--nodes", "9" * 5000], ["--set", "resources.nodes=" + "9" * 5000],
    ["--set", "resources.memory_gb=1e308", "--site", "aurora", "--set", "resources.account=a"],
    ["--run-dir", "/tmp/\udcff", "-o", "/tmp/never-written.sh"],
])
def test_cli_numbers_and_bytes_are_one_line_errors(args: list[str]) -> None:
    done = subprocess.run([sys.executable, "-m", "hpctrain", "render", str(JOB), *args], capture_output=True,
                          cwd=REPO, timeout=120)
    err = done.stderr.decode(errors="replace")
    last = err.strip().splitlines()[-1]  # argparse's usage may come first
    assert done.returncode == 2 and "Traceback" not in err and "error:" in last and len(last) < 400, err


def test_a_yaml_integer_past_the_digit_limit_names_its_key(tmp_path: Path) -> None:
    path = tmp_path / "j.yaml"
    path.write_text(JOB.read_text().replace("steps: 300", "steps: " + "9" * 5000))
    with pytest.raises(ConfigError) as info:
        load_job(path)
    assert "train.steps" in str(info.value) and f"{path}:" in str(info.value)


def _probe(**answers: str) -> Probe:
    sections = {"host": Section("login1"), "user": Section("alice"), "cpus": Section("32"),
                "memory": Section(str(64 * 2 ** 20)), "end": Section(),
                "programs": Section("\n".join(f"{p} /usr/bin/{p}" for p in ("sinfo", "scontrol", "qstat", "qsub",
                                                                             "pbsnodes")))}
    sections.update({name: Section(text, "", 0) for name, text in answers.items()})
    return Probe(sections)


PART = "PartitionName={} Default=YES MaxNodes={} MaxTime=01:00:00 MinNodes=1 Nodes=n1 State=UP TotalNodes=1\n"
NODE = ("NodeName=n1 CoresPerSocket=4 CPUTot={} RealMemory={} Sockets=1 ThreadsPerCore=1 State=IDLE "
        "Partitions=debug\n")


@pytest.mark.parametrize("answers", [
    {"slurm_partitions": PART.format("debug", "²"), "slurm_nodes": NODE.format(4, 1000)},
    {"slurm_partitions": PART.format("debug", 1), "slurm_nodes": NODE.format(4, "9" * 400)},
    {"slurm_partitions": PART.format("debug", 1), "slurm_nodes": NODE.format("9" * 5000, 1000)},
    {"slurm_partitions": "".join(PART.format(f"p{i}", 1) for i in range(20000)), "slurm_nodes": NODE.format(4, 9)},
    {"slurm_partitions": PART.format("a,b", 1) + PART.format("debug", 1), "slurm_nodes": NODE.format(4, 1000)},
], ids=["superscript", "400-digit-memory", "5000-digit-cpus", "20000-partitions", "comma"])
def test_hostile_slurm_output_gives_a_profile(answers: dict[str, str]) -> None:
    draft = draft_profile(findings_from(_probe(**answers)))
    assert all("," not in q for q in draft.profile.queues) and len(draft.profile.queues) <= 200


@pytest.mark.parametrize("answers", [
    {"qstat_queues": "", "pbs_queues_json": '{"Queue": {"q1": "x"}}', "pbs_nodes_json": '{"nodes": {"n1": "y"}}'},
    {"qstat_queues": "", "pbs_queues_json": "[" * 100_000 + "]" * 100_000},
    {"qstat_queues": "", "pbs_queues": "Queue: q1\n    queue_type = Execution\n    resources_max.nodect = "
     + "9" * 5000 + "\n"},
], ids=["string-entries", "nested-100000", "5000-digits"])
def test_hostile_pbs_output_names_the_input_or_gives_a_profile(answers: dict[str, str]) -> None:
    try:
        draft_profile(findings_from(_probe(**answers)))
    except HpctrainError as exc:
        assert "bug in hpctrain" not in str(exc)


@pytest.mark.parametrize("values", [{"timeout_min": float("inf")}, {"timeout_min": 1e308}, {"mem_gb": 1e308},
                                    {"mem_gb": float("nan")}, {"nodes": 10 ** 5000}])
def test_submitit_numbers_out_of_range_are_parameter_errors(values: dict[str, object]) -> None:
    with pytest.raises(ValueError) as info:
        check_values(values)
    assert next(iter(values)) in str(info.value) and len(str(info.value)) < 300


def test_submitit_none_is_the_default() -> None:
    job = build_job({"gpus_per_node": None, "tasks_per_node": 2}, max_requeues=1, name="x")
    assert job.resources.gpus_per_rank == 0 and job.resources.ranks_per_node == 2
