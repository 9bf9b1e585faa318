"""intel-extension-for-pytorch only on Intel CPUs beside the torch it pairs with (issue 14, item 2).

IPEX cannot import beside torch 2.13 (its last release pairs with 2.8), so the decision is tested with the facts it
reads given explicitly, and the one-line fallback through ``maybe_optimize`` on this machine as it is.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hpctrain.runtime import intel


@pytest.mark.parametrize(("device", "vendor", "ipex", "torch_version", "reason"), [
    ("xpu", "GenuineIntel", "2.8.0", "2.8.0", "computes on xpu"),
    ("cuda", "GenuineIntel", "2.8.0", "2.8.0", "computes on cuda"),
    ("cpu", "AuthenticAMD", "2.8.0", "2.8.0", "not an Intel one (AuthenticAMD)"),
    ("cpu", "GenuineIntel", "", "2.13.0+cpu", "not installed"),
    ("cpu", "GenuineIntel", "2.8.0+cpu", "2.13.0+cpu", "IPEX 2.8.0+cpu pairs with torch 2.8, and this is torch 2.13"),
    ("cpu", "GenuineIntel", "2.8.10+xpu", "2.8.0", None),
])
def test_ipex_is_used_only_on_intel_cpus_beside_its_own_torch(device: str, vendor: str, ipex: str,
                                                               torch_version: str, reason: str | None) -> None:
    got = intel.ipex_refusal(torch.device(device), vendor=vendor, ipex_version=ipex, torch_version=torch_version)
    if reason is None:
        assert got is None
    else:
        assert got is not None and reason in got


def test_the_cpu_vendor_is_read_from_cpuinfo(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Xeon\n")
    assert intel.cpu_vendor(info) == "GenuineIntel"
    assert intel.cpu_vendor(tmp_path / "missing") == "unknown"


def test_here_ipex_is_refused_once_with_the_reason_and_training_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    """This machine: no IPEX installed (and an AMD CPU in CI): one warning line from the announcing rank only."""
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with caplog.at_level("INFO", logger="hpctrain.intel"):
        assert intel.maybe_optimize(model, optimizer, wanted=True, device=torch.device("cpu"), announce=False) == (
            model, optimizer, False)
        assert caplog.records == []
        assert intel.maybe_optimize(model, optimizer, wanted=True, device=torch.device("cpu")) == (
            model, optimizer, False)
    (record,) = caplog.records
    reason = intel.ipex_refusal(torch.device("cpu"))
    assert reason is not None and record.getMessage() == intel.FALLBACK_LINE % reason
    assert intel.installed_ipex() is None  # the project installs no IPEX (no `intel` extra)
