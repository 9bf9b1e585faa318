"""Which device a rank computes on, and whether the installed torch can reduce there.

A GPU site's profile names the backend for its GPU kind (config/site.DEVICE_BACKENDS): ``nccl`` on NVIDIA,
the same ``nccl`` on AMD (a ROCm build of torch runs RCCL behind it, on ``cuda`` devices), ``xccl`` on Intel
GPUs (oneCCL behind ``torch.xpu``). The rendered script exports the site, its GPU kind and the backend; a torch
that lacks the backend is refused in one line that says what to install.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from hpctrain.errors import ConfigError

# The torch device type each device backend reduces on (a ROCm build calls AMD GPUs "cuda").
DEVICE_TYPE = {"nccl": "cuda", "xccl": "xpu"}
GPU_KIND_ENV = "HPCTRAIN_GPU_KIND"  # exported by the rendered script from the site's node.gpu_kind
SITE_ENV = "HPCTRAIN_SITE"
INSTALL = {
    "nvidia": "a CUDA build of torch (pip install torch --index-url https://download.pytorch.org/whl/cuXYZ for "
              "the node's driver, or the centre's PyTorch module)",
    "amd": "a ROCm build of torch (pip install torch --index-url https://download.pytorch.org/whl/rocmX.Y, or the "
           "centre's PyTorch module): its nccl backend is RCCL",
    "intel": "torch built for Intel GPUs (pip install torch --index-url https://download.pytorch.org/whl/xpu, or "
             "ALCF's frameworks module)",
}


def torch_build() -> str:
    """The installed torch and what it was built for: ``2.13.0+cpu``, ``2.8.0 (CUDA 12.8)``, ``... (XPU)``."""
    if torch.version.hip:
        return f"{torch.__version__} (ROCm {torch.version.hip})"
    if torch.version.cuda:
        return f"{torch.__version__} (CUDA {torch.version.cuda})"
    if getattr(torch.version, "xpu", None):
        return f"{torch.__version__} (XPU)"
    return torch.__version__


def backend_in_torch(backend: str) -> bool:
    """Whether this torch build has the device backend's process group (nccl: CUDA or ROCm; xccl: XPU)."""
    import torch.distributed as dist

    if not dist.is_available():
        return False
    probe = {"nccl": dist.is_nccl_available, "xccl": getattr(dist, "is_xccl_available", lambda: False)}
    return bool(probe[backend]())


def device_count(device_type: str) -> int:
    """Devices of ``device_type`` (cuda, xpu) this process sees; 0 when torch has no such module."""
    module = getattr(torch, device_type, None)
    try:
        return int(module.device_count()) if module is not None and module.is_available() else 0
    except (RuntimeError, AssertionError):  # a build without the device's runtime
        return 0


def gpu_kind(backend: str, environ: Mapping[str, str]) -> str:
    """The site's GPU kind (from the script), else what the backend and this torch imply."""
    kind = environ.get(GPU_KIND_ENV, "").strip()
    if kind in INSTALL:
        return kind
    if backend == "xccl":
        return "intel"
    return "amd" if torch.version.hip else "nvidia"


def require_device_backend(backend: str, environ: Mapping[str, str]) -> str:
    """The device type ``backend`` reduces on, or a one-line ConfigError naming the site, the backend and the fix.

    Refused: a torch without the backend (the CPU wheel has neither nccl nor xccl), or no device of that type
    visible to this rank.
    """
    site = environ.get(SITE_ENV, "").strip() or "this machine"
    kind = gpu_kind(backend, environ)
    if not backend_in_torch(backend):
        raise ConfigError(f"site {site!r} reduces over {backend} on {kind} GPUs, but the installed torch "
                          f"{torch_build()} has no {backend}", key="comm_backend", hint=f"install {INSTALL[kind]}")
    device_type = DEVICE_TYPE[backend]
    if device_count(device_type) == 0:
        raise ConfigError(f"site {site!r} reduces over {backend}, but this rank sees no {device_type} device",
                          key="comm_backend", hint="ask for resources.gpus_per_rank on a GPU node (or check "
                          "CUDA_VISIBLE_DEVICES / ROCR_VISIBLE_DEVICES / ZE_AFFINITY_MASK)")
    return device_type


def pick_device(gpus_per_rank: int, backend: str, local_rank: int) -> torch.device:
    """The device this rank computes on: the backend's (nccl: cuda, xccl: xpu), else any GPU the job asked for
    (CUDA/ROCm, then XPU; MPI and gloo then reduce through host buffers), else the CPU.

    After the affinity wrapper a rank sees only its own devices, so ``local_rank`` modulo what it sees is 0.
    """
    wanted = DEVICE_TYPE.get(backend)
    candidates = [wanted] if wanted else (["cuda", "xpu"] if gpus_per_rank > 0 else [])
    for device_type in candidates:
        count = device_count(device_type)
        if count:
            return torch.device(device_type, local_rank % count)
    return torch.device("cpu")


def make_current(device: torch.device) -> None:
    """Make ``device`` the current one of its kind, so collectives and ``.to('cuda')`` land on it."""
    if device.type in DEVICE_TYPE.values():
        getattr(torch, device.type).set_device(device)


def on_device(tensor: torch.Tensor, device_type: str) -> torch.Tensor:
    """``tensor`` itself when it already lives on ``device_type`` and is contiguous (a device buffer is reduced in
    place, no host copy), else a contiguous copy there."""
    if tensor.device.type == device_type and tensor.is_contiguous():
        return tensor
    return tensor.detach().to(device_type).contiguous()
