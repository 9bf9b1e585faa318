#!/usr/bin/env python3
"""Regenerate tests/golden/<job>__<site>.sh: the rendered script of every shipped job on every shipped site.

A combination the site refuses holds ``REFUSED: <message>``. Run after an intended change to rendering:
``python scripts/refresh_golden.py``; ``git diff tests/golden`` then shows what changed.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from hpctrain.config.job import load_job  # noqa: E402
from hpctrain.config.site import SiteProfile, load_site_file  # noqa: E402
from hpctrain.errors import ConfigError  # noqa: E402
from hpctrain.submission.render import render_script  # noqa: E402

GOLDEN = ROOT / "tests" / "golden"
RUN_DIR = "/RUN_DIR"
SPEC_PATH = "/RUN_DIR/job.yaml"
# 'auto' node figures (the local site) are pinned so the files do not depend on the machine.
PINNED_AUTO = {"cores": 8, "memory_gb": 16.0}


def golden_site(name: str) -> SiteProfile:
    """A shipped profile, read from site_configs/ (not the user's search path), with 'auto' pinned."""
    site = load_site_file(ROOT / "site_configs" / f"{name}.yaml")
    pinned = {k: v for k, v in PINNED_AUTO.items() if getattr(site.node, k) == "auto"}
    if pinned:
        site = site.model_copy(update={"node": site.node.model_copy(update=pinned)})
    return site


# Variants of shipped jobs, so every site has at least one rendered script and every per-job scheduler option is
# shown: name -> (job, --set overrides, the sites it is rendered on; () for all).
_OPTIONS = ("resources.exclusive=true", "resources.workdir=/scratch/ffn")
VARIANTS: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    "ffn-local.account": ("ffn-local", ("resources.account=demo",), ()),
    # OLCF's debug is a QOS on the batch partition (-q debug), not a partition.
    "ffn-frontier.debug": ("ffn-frontier", ("resources.queue=debug", "resources.nodes=2"), ("frontier",)),
    "ffn-perlmutter.options": ("ffn-perlmutter", (*_OPTIONS, "resources.reservation=ffn-res",
                                                  "resources.directives={mail-type: END}"), ("perlmutter",)),
    # A PBS Pro reservation is a queue (R123456); -r y makes the job rerunnable.
    "ffn-polaris.options": ("ffn-polaris", (*_OPTIONS, "resources.reservation=R123456",
                                            "resources.directives={r: y}"), ("polaris",)),
    "ffn-theta.options": ("ffn-theta", (*_OPTIONS, "resources.reservation=ffn-res",
                                        "resources.directives={M: ffn@example.org}"), ("theta",)),
    "ffn-local.options": ("ffn-local", _OPTIONS, ("local",)),
    # Staging to node-local storage (issue 12): the environment archive and the input files, by sbcast on Slurm and
    # one process per node through the site's launcher on PBS Pro and Cobalt; containers on each runtime.
    "ffn-frontier.staged": ("ffn-frontier", ("staging={environment: archive, data: true}",), ("frontier",)),
    "ffn-polaris.staged": ("ffn-polaris", ("staging={environment: archive, data: true}",), ("polaris",)),
    "ffn-theta.staged": ("ffn-theta", ("staging={environment: archive, data: [data.coordinates]}",), ("theta",)),
    "ffn-local.staged": ("ffn-local", ("staging.environment=archive",), ("ci-slurm",)),
    "ffn-aurora.container": ("ffn-aurora", ("staging={environment: container, data: true, container: {image: "
                                            "/lus/flare/projects/connectomics/ffn.sif}}",), ("aurora",)),
    "ffn-frontier.container": ("ffn-frontier", ("staging={environment: container, container: {image: "
                                                "/lustre/orion/csc000/proj-shared/ffn.sif}}",), ("frontier",)),
    "ffn-perlmutter.container": ("ffn-perlmutter", ("staging={environment: container, container: {runtime: "
                                                    "podman-hpc, image: nersc/ffn:1.0}}",), ("perlmutter",)),
    "ffn-perlmutter.shifter": ("ffn-perlmutter", ("staging={environment: container, container: {runtime: shifter, "
                                                  "image: 'docker:nersc/ffn:1.0'}}",), ("perlmutter",)),
}


def cases() -> list[tuple[str, str, Path]]:
    """(job or variant name, site name, golden file) for every shipped job x site, and every variant x its sites."""
    jobs = sorted(p.stem for p in (ROOT / "jobs").glob("*.yaml"))
    sites = sorted(p.stem for p in (ROOT / "site_configs").glob("*.yaml"))
    found = [(j, s) for j in jobs for s in sites]
    found += [(v, s) for v in sorted(VARIANTS) for s in (VARIANTS[v][2] or sites)]
    return [(j, s, GOLDEN / f"{j}__{s}.sh") for j, s in found]


def render_case(job_name: str, site_name: str) -> str:
    """The golden text of one case: the script, or the refusal message."""
    base, sets, _ = VARIANTS.get(job_name, (job_name, (), ()))
    job = load_job(ROOT / "jobs" / f"{base}.yaml", sets=list(sets))
    try:
        return render_script(job, golden_site(site_name), run_dir=RUN_DIR, spec_path=SPEC_PATH).text
    except ConfigError as exc:  # it names the job file: relative to the checkout, so goldens do not move with it
        return f"REFUSED: {str(exc).replace(str(ROOT) + '/', '')}\n"


def main() -> int:
    GOLDEN.mkdir(parents=True, exist_ok=True)
    wanted = set()
    changed = 0
    for job_name, site_name, path in cases():
        wanted.add(path)
        text = render_case(job_name, site_name)
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            changed += 1
            print(f"updated {path.relative_to(ROOT)}")
    for stale in sorted(set(GOLDEN.glob("*.sh")) - wanted):
        stale.unlink()
        print(f"removed {stale.relative_to(ROOT)}")
    print(f"{len(wanted)} golden files, {changed} changed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
