"""Validation on published scaling results (hpctrain_bench/published.py): the studies cover what the method
needs (a communication-bound model whose efficiency falls with N, several GPUs per node, a run above 1000
nodes), every input has a source or is marked guessed, nothing is fitted, the network terms move the
predictions, and docs/planning.md prints the table the code computes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain.config.site import load_site
from hpctrain_bench import ffn_theta
from hpctrain_bench import published as pb

DOCS = Path(__file__).resolve().parent.parent / "docs" / "planning.md"


def test_the_studies_cover_what_the_validation_needs() -> None:
    systems = {s.system for s in pb.STUDIES}
    citations = {s.citation for s in pb.STUDIES}
    assert len(systems) >= 5 and len(citations) >= 5  # five publications besides the Theta study
    assert len(pb.validate()) >= 15
    assert any(float(s.site["ranks_per_node"].value) > 1 for s in pb.STUDIES)  # several GPUs per node
    assert any(max(s.published) > 1000 for s in pb.STUDIES)  # above 1000 nodes
    falling = [s for s in pb.STUDIES if len(s.published) > 1
               and s.published[max(s.published)] < s.published[min(s.published)] - 0.05]
    assert falling  # a communication-bound model whose published efficiency falls with N


def test_every_input_has_a_source_and_nothing_is_fitted() -> None:
    for study in pb.STUDIES:
        for name, fig in study.figures():
            assert fig.source.strip(), (study.key, name)
        params = pb.study_parameters(study)
        assert not [n for n, p in params.items() if p.source == "fitted"], study.key


def test_the_model_shows_the_communication_bound_fall() -> None:
    vgg = next(s for s in pb.STUDIES if s.key == "horovod-vgg-16")
    w = pb.workload(vgg)
    assert pb.efficiency(w, 32) - pb.efficiency(w, 128) > 0.03  # published: 0.79 -> 0.68


@pytest.mark.parametrize("what", ["no all-reduce", "network 10x worse"])
def test_the_network_terms_move_a_validated_prediction(what: str) -> None:
    base = pb.validate()
    if what == "no all-reduce":
        changed = pb.validate({"grad_bytes": 0.0})
    else:
        changed = []
        for study in pb.STUDIES:
            nic = float(pb.study_parameters(study).num("nic_gbps"))
            w = pb.workload(study, {"nic_gbps": nic / 10})
            changed += [pb.Point(study, n, e, pb.study_efficiency(study, w, n))
                        for n, e in sorted(study.published.items())]
    moved = max(abs(a.predicted - b.predicted) for a, b in zip(base, changed, strict=True))
    assert moved > 0.05, what


def test_errors_have_both_signs() -> None:
    errors = [p.error for p in pb.validate()]
    assert min(errors) < 0 < max(errors)


@pytest.mark.xfail(strict=True, reason="not met: 12 of 26 points, all over-predicted by 0.06 to 0.48 - the DLPerf "
                   "Horovod runs on 2 and 4 servers (NCCL over sockets of unpublished speed), the two Cray Aries runs "
                   "above 5000 nodes, Goyal's Caffe2 + gloo, Horovod's 2017 benchmarks at 32 servers "
                   "(docs/planning.md, validation 2: which points miss, and why)")
def test_every_published_point_within_tolerance() -> None:
    worst = max(pb.validate(), key=lambda p: abs(p.error))
    assert abs(worst.error) <= pb.TOLERANCE, (worst.study.key, worst.nodes, worst.error)


def test_one_gpu_reference_points_are_against_one_gpu() -> None:
    """DLPerf's and NVIDIA's efficiencies are throughput at N GPUs over N x one GPU alone: one node of one rank
    is the reference, so even one full node shows its straggler and reduction losses."""
    study = next(s for s in pb.STUDIES if s.key == "dlperf-pytorch-resnet-50")
    w = pb.workload(study)
    assert study.reference_ranks == 1
    assert pb.study_efficiency(study, w, 1) < pb.efficiency(w, 1) == 1.0


def test_docs_print_the_table_the_code_computes() -> None:
    text = DOCS.read_text(encoding="utf-8")
    for row in [*pb.table_rows(), *pb.sensitivity_rows()]:
        assert row in text, f"docs/planning.md is stale (run python benchmarks/plan.py): {row}"


def test_theta_still_within_tolerance_with_its_fitted_values_unchanged() -> None:
    fit = ffn_theta.fit_study(load_site("theta"))
    assert fit.max_error <= ffn_theta.TOLERANCE
    values = fit.fitted()  # the values docs/planning.md reports: the new terms do not move the Theta fit
    assert values["multinode_overhead_s"] == pytest.approx(0.195, abs=0.002)
    assert values["record_s"] == pytest.approx(243e-6, abs=2e-6)
