"""intel-extension-for-pytorch (IPEX) as an optional accelerator on Intel CPUs, where the installed torch is one it
supports; everywhere else stock PyTorch, with one log line that says why.

IPEX's development stopped after 2.8 (its last CPU release, paired with torch 2.8; the repository was archived in
March 2026) and an IPEX release imports only beside the torch of its own major.minor. Intel GPUs need no IPEX:
torch reaches them itself (``torch.xpu``, process-group backend ``xccl``). So IPEX is used only when the rank
computes on the CPU, the CPU is Intel's, and the installed IPEX pairs with the installed torch; hpctrain does
not install it (no ``intel`` extra: IPEX's wheels declare no torch requirement, so pip would put 2.8 beside our
torch 2.13, where it refuses to import).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path

import torch

log = logging.getLogger("hpctrain.intel")

ENV_VAR = "HPCTRAIN_INTEL_EXTENSION"  # exported by the rendered script from site.intel_extension
FALLBACK_LINE = "intel-extension-for-pytorch not in use: %s; training continues with stock PyTorch"
DISTRIBUTION = "intel-extension-for-pytorch"


def wanted_from_env(environ: Mapping[str, str]) -> bool:
    """Whether the site asked for IPEX (``HPCTRAIN_INTEL_EXTENSION=1``, also true/yes/on)."""
    return environ.get(ENV_VAR, "").strip().lower() in ("1", "true", "yes", "on")


def cpu_vendor(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's vendor id (``GenuineIntel``, ``AuthenticAMD``), or ``unknown`` where Linux does not say."""
    try:
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "vendor_id":
                return value.strip()
    except OSError:
        pass
    return "unknown"


def installed_ipex() -> str | None:
    """The installed IPEX version (read from its metadata: importing a mismatched IPEX fails), or None."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return None


def _major_minor(version: str) -> str:
    return ".".join(version.split("+")[0].split(".")[:2])


def ipex_refusal(device: torch.device, *, vendor: str | None = None, ipex_version: str | None = None,
                 torch_version: str | None = None) -> str | None:
    """Why IPEX is not used on ``device`` here (None: it may be). The keywords replace what is read from the
    machine (tests)."""
    if device.type != "cpu":
        return f"it is for Intel CPUs and this rank computes on {device.type} (torch drives Intel GPUs itself)"
    vendor = cpu_vendor() if vendor is None else vendor
    if vendor != "GenuineIntel":
        return f"the CPU is not an Intel one ({vendor})"
    ipex_version = installed_ipex() if ipex_version is None else ipex_version
    torch_version = torch.__version__ if torch_version is None else torch_version
    if not ipex_version:
        return (f"it is not installed (it exists for torch up to 2.8: pip install "
                f"'{DISTRIBUTION}=={_major_minor(torch_version)}.*' where that torch is used)")
    if _major_minor(ipex_version) != _major_minor(torch_version):
        return (f"IPEX {ipex_version} pairs with torch {_major_minor(ipex_version)}, and this is torch "
                f"{torch_version}")
    return None


def maybe_optimize(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    wanted: bool,
    device: torch.device,
    announce: bool = True,
) -> tuple[torch.nn.Module, torch.optim.Optimizer, bool]:
    """``ipex.optimize`` the model and optimizer in place when wanted and possible: (model, optimizer, used).

    ``announce`` says whether this rank logs the outcome (the trainer lets rank 0 speak for the job). Anything
    that rules IPEX out (``ipex_refusal``), or a failure to import or to optimize, falls back to stock PyTorch.
    """
    if not wanted:
        return model, optimizer, False
    reason = ipex_refusal(device)
    if reason is not None:
        _fallback(reason, announce)
        return model, optimizer, False
    try:
        import intel_extension_for_pytorch as ipex  # type: ignore[import-not-found]
    except Exception as exc:  # ImportError, or IPEX's own version check failing
        _fallback(f"cannot import it ({type(exc).__name__}: {_first_line(exc)})", announce)
        return model, optimizer, False
    try:
        # inplace=True keeps the model and optimizer objects the task and the reducer already hold.
        model, optimizer = ipex.optimize(model, optimizer=optimizer, inplace=True)
    except Exception as exc:  # an unsupported layer or device must not stop training
        _fallback(f"ipex.optimize failed on {device} ({type(exc).__name__}: {_first_line(exc)})", announce)
        return model, optimizer, False
    if announce:
        log.info("intel-extension-for-pytorch %s in use (ipex.optimize on %s)",
                 getattr(ipex, "__version__", "?"), device)
    return model, optimizer, True


def _fallback(reason: str, announce: bool) -> None:
    if announce:
        log.warning(FALLBACK_LINE, reason)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else "no message"
