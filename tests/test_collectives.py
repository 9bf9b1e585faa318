"""The collective library's environment (environment.collectives): a block of its own in the batch script, as the
centre documents it, that a job's env overrides variable by variable; and the shipped GPU sites carry theirs."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from hpctrain.config.job import JobSpec
from hpctrain.config.site import load_site_file
from hpctrain.errors import ConfigError
from hpctrain.submission.render import render_script

ROOT = Path(__file__).resolve().parents[1]
SITES = ROOT / "hpctrain" / "site_configs"


def _job(env: dict[str, str] | None = None) -> JobSpec:
    return JobSpec.model_validate({
        "name": "tiny", "model": "resnet", "train": {"steps": 1, "batch_per_rank": 1, "lr": 0.1},
        "resources": {"nodes": 1, "ranks_per_node": 2, "threads_per_rank": 1, "walltime": "00:10:00"},
        "env": env or {}})


def _site(tmp_path: Path, collectives: str) -> Path:
    path = tmp_path / "lab.yaml"
    path.write_text(textwrap.dedent("""\
        name: lab
        scheduler: slurm
        launcher: srun
        node: {cores: 4, threads_per_core: 1, memory_gb: 8}
        queues:
          batch: {max_nodes: 2, max_walltime: "01:00:00"}
        default_queue: batch
        environment:
          modules: [base/1]
          env: {SITE_VAR: "1"}
        """) + textwrap.indent(textwrap.dedent(collectives), "  "))
    return path


def _lines(text: str) -> list[str]:
    return text.splitlines()


def test_the_block_stands_alone_after_the_site_modules_and_a_job_env_wins(tmp_path: Path) -> None:
    site = load_site_file(_site(tmp_path, """\
        collectives:
          library: NCCL + aws-ofi-nccl plug-in
          source: "Lab guide, 'NCCL' (lab.example.org/nccl, read 2026-11-28)"
          modules: [nccl-plugin/1.9]
          env: {NCCL_NET: AWS Libfabric, FI_CXI_DEFAULT_CQ_SIZE: "131072"}
          setup: ['export LD_LIBRARY_PATH="/soft/ofi/v1.9/lib:${LD_LIBRARY_PATH}"']
        """))
    lines = _lines(render_script(_job({"NCCL_NET": "Socket"}), site, run_dir="/r", spec_path="/r/j.yaml").text)
    header = next(i for i, line in enumerate(lines) if line.startswith("# collective library"))
    assert "NCCL + aws-ofi-nccl plug-in" in lines[header] and "lab.example.org/nccl" in lines[header]
    assert "a job's env overrides" in lines[header]
    assert lines.index("module load base/1") < header  # after the site's own modules
    block = lines[header + 1:header + 5]
    assert block == ["module load nccl-plugin/1.9",
                     "export NCCL_NET=Socket",  # the job's value, exported before the setup lines run
                     "export FI_CXI_DEFAULT_CQ_SIZE=131072",
                     'export LD_LIBRARY_PATH="/soft/ofi/v1.9/lib:${LD_LIBRARY_PATH}"']
    # The job's own value is exported again among its env, after the site's: it wins there as well.
    assert lines.index("export NCCL_NET=Socket", header + 5) > lines.index("export SITE_VAR=1")
    assert "export NCCL_NET='AWS Libfabric'" not in lines


def test_a_bad_variable_name_in_the_block_is_refused_with_its_key_and_no_block_without_one(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"lab.yaml:12: environment\.collectives\.env: 'NCCL NET' is not a valid "
                       "environment variable name"):
        load_site_file(_site(tmp_path, """\
            collectives:
              env: {"NCCL NET": x}
            """))
    plain = tmp_path / "plain"
    plain.mkdir()
    text = render_script(_job(), load_site_file(_site(plain, "")), run_dir="/r", spec_path="/r/j.yaml").text
    assert "# collective library" not in text


@pytest.mark.parametrize(("site", "must"), [
    ("polaris", ["export NCCL_NET='AWS Libfabric'", "export FI_MR_CACHE_MONITOR=userfaultfd",
                 "/soft/libraries/aws-ofi-nccl/"]),
    ("frontier", ["module load rccl-net-plugin", "export FI_CXI_RDZV_PROTO=alt_read",
                  "export NCCL_SOCKET_IFNAME=hsn0,hsn1,hsn2,hsn3"]),
    ("aurora", ["export CCL_PROCESS_LAUNCHER=pmix", "export CCL_ATL_TRANSPORT=mpi", "export CCL_KVS_MODE=mpi",
                "export FI_MR_CACHE_MONITOR=userfaultfd"]),
    ("perlmutter", ["export NCCL_NET_GDR_LEVEL=PHB"]),
])
def test_shipped_gpu_sites_render_their_collective_library_block(site: str, must: list[str]) -> None:
    profile = load_site_file(SITES / f"{site}.yaml")
    assert profile.environment.collectives.library, f"{site}: the block names its library"
    job = JobSpec.model_validate({
        "name": "g", "model": "resnet", "train": {"steps": 1, "batch_per_rank": 1, "lr": 0.1},
        "resources": {"nodes": 1, "ranks_per_node": 1, "threads_per_rank": 1, "gpus_per_rank": 1,
                      "walltime": "00:30:00", "account": "a1"}})
    text = render_script(job, profile, run_dir="/r", spec_path="/r/j.yaml").text
    block = text[text.index("# collective library"):text.index("# environment (site, then job")]
    for line in must:
        assert line in block, f"{site}: {line!r} missing from\n{block}"
