"""intel-extension-for-pytorch (IPEX) when the site profile asks for it and it imports; else stock PyTorch.

PyPI's IPEX wheels import only beside the torch release they were built for (2.8; we pin 2.13), so on CI
the fallback path is the one exercised: one log line says IPEX is not in use and training goes on.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import torch

log = logging.getLogger("hpctrain.intel")

ENV_VAR = "HPCTRAIN_INTEL_EXTENSION"  # exported by the rendered script from site.intel_extension
FALLBACK_LINE = "intel-extension-for-pytorch not in use: %s; training continues with stock PyTorch"


def wanted_from_env(environ: Mapping[str, str]) -> bool:
    """Whether the site asked for IPEX (``HPCTRAIN_INTEL_EXTENSION=1``, also true/yes/on)."""
    return environ.get(ENV_VAR, "").strip().lower() in ("1", "true", "yes", "on")


def maybe_optimize(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    wanted: bool,
    device: torch.device,
    announce: bool = True,
) -> tuple[torch.nn.Module, torch.optim.Optimizer, bool]:
    """``ipex.optimize`` the model and optimizer in place when wanted and possible: (model, optimizer, used).

    ``announce`` says whether this rank logs the outcome (the trainer lets rank 0 speak for the job). Any
    failure to import or to optimize falls back to stock PyTorch; IPEX raises RuntimeError, not only
    ImportError, when its torch version does not match.
    """
    if not wanted:
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
