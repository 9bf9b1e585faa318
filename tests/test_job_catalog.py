"""Job specs by name (``hpctrain/config/job_catalog.py``): the shipped examples and the user's own are found
from any directory wherever a job spec is accepted, ``jobs list|copy`` work, and a path that names no file is
refused with the names that exist. The commands run in this process (``hpctrain.cli.main``)."""

from __future__ import annotations

from pathlib import Path

import pytest

import hpctrain
from hpctrain.cli import main
from hpctrain.config.job import load_job
from hpctrain.config.job_catalog import available_jobs, copy_job, locate_job, shipped_jobs_dir
from hpctrain.errors import ConfigError

REPO = Path(__file__).resolve().parent.parent
SHIPPED = sorted(p.stem for p in (REPO / "hpctrain" / "jobs").glob("*.yaml"))


@pytest.fixture(autouse=True)
def elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory outside the checkout and a config home of its own (no user's job specs)."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("HPCTRAIN_JOBS", raising=False)
    return work


def test_every_shipped_example_is_found_by_name_from_any_directory() -> None:
    assert len(SHIPPED) >= 8
    assert sorted(available_jobs()) == SHIPPED
    for name in SHIPPED:
        path = locate_job(name)
        assert path == shipped_jobs_dir() / f"{name}.yaml" and path.is_file()
        assert load_job(name).name == name
    assert shipped_jobs_dir().is_relative_to(Path(hpctrain.__file__).parent)


def test_a_file_wins_over_a_name_and_the_users_directory_over_the_shipped_one(
        elsewhere: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    own = tmp_path / "config" / "hpctrain" / "jobs"
    own.mkdir(parents=True)
    text = (shipped_jobs_dir() / "resnet-local.yaml").read_text().replace("steps: 300", "steps: 7")
    (own / "resnet-local.yaml").write_text(text)
    assert locate_job("resnet-local") == own / "resnet-local.yaml"
    assert load_job("resnet-local").train.steps == 7
    first = tmp_path / "first"
    first.mkdir()
    (first / "resnet-local.yaml").write_text(text.replace("steps: 7", "steps: 9"))
    monkeypatch.setenv("HPCTRAIN_JOBS", str(first))
    assert load_job("resnet-local").train.steps == 9
    (elsewhere / "resnet-local").write_text(text.replace("steps: 7", "steps: 11"))  # a file of that very name
    assert load_job("resnet-local").train.steps == 11


def test_an_unknown_name_lists_the_names_and_guesses() -> None:
    with pytest.raises(ConfigError) as raised:
        load_job("ffn-tehta")
    message = str(raised.value)
    assert "no job spec named 'ffn-tehta'" in message and "did you mean 'ffn-theta'?" in message
    for name in SHIPPED:
        assert name in message


def test_the_checkout_path_outside_a_checkout_names_the_shipped_example(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["jobs", "validate", "jobs/ffn-theta.yaml", "--site", "theta"])
    err = capsys.readouterr().err
    assert code != 0
    assert err.count("\n") == 1, err
    assert "jobs/ffn-theta.yaml: file not found" in err and "give its name (ffn-theta)" in err


def test_a_missing_file_of_no_known_name_lists_the_names(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["render", "mine/typo.yaml", "--site", "theta"])
    err = capsys.readouterr().err
    assert code != 0 and "mine/typo.yaml: file not found" in err and "resnet-local" in err, err


def test_the_readme_laptop_commands_take_names(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["jobs", "validate", "ffn-theta", "--site", "theta", "--nodes", "256"]) == 0
    assert "ffn-theta: ok on theta" in capsys.readouterr().out
    assert main(["render", "ffn-theta", "--site", "theta"]) == 0
    assert "#COBALT" in capsys.readouterr().out
    assert main(["jobs", "show", "ffn-local"]) == 0
    assert "name: ffn-local" in capsys.readouterr().out


def test_jobs_list_shows_every_name_with_its_model(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["jobs", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["NAME", "MODEL", "NODES"]
    listed = {line.split()[0]: line.split()[1] for line in lines[1:]}
    assert sorted(listed) == SHIPPED
    assert listed["ffn-theta"] == "ffn" and listed["resnet-local"] == "resnet"


def test_jobs_list_lists_a_broken_draft_without_failing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    own = tmp_path / "config" / "hpctrain" / "jobs"
    own.mkdir(parents=True)
    (own / "draft.yaml").write_text("name: draft\nmodel: ffn\nresources: {nodes: many}\n")
    assert main(["jobs", "list"]) == 0
    out = capsys.readouterr().out
    assert any(line.startswith("draft ") and "BROKEN" in line for line in out.splitlines()), out


def test_jobs_copy_writes_the_spec_and_keeps_an_existing_file(elsewhere: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["jobs", "copy", "resnet-local"]) == 0
    copied = elsewhere / "resnet-local.yaml"
    assert copied.read_text() == (shipped_jobs_dir() / "resnet-local.yaml").read_text()
    assert "wrote" in capsys.readouterr().out
    copied.write_text(copied.read_text().replace("steps: 300", "steps: 5"))
    assert main(["jobs", "copy", "resnet-local"]) != 0
    err = capsys.readouterr().err
    assert "exists already; it is kept" in err and "--force" in err
    assert "steps: 5" in copied.read_text()
    assert load_job("resnet-local.yaml").train.steps == 5  # the copy, not the shipped spec
    assert main(["jobs", "copy", "resnet-local", "--force"]) == 0
    assert "steps: 300" in copied.read_text()
    assert sorted(p.name for p in elsewhere.iterdir()) == ["resnet-local.yaml"]  # no partial file left


def test_jobs_copy_into_a_missing_directory_writes_nothing(elsewhere: Path) -> None:
    with pytest.raises(ConfigError, match="not a directory"):
        copy_job("ffn-local", elsewhere / "nowhere")
    assert list(elsewhere.iterdir()) == []
