"""One device abstraction for cpu, cuda, xpu and mps: ``get_device``, ``synchronize`` and the autocast questions."""

from __future__ import annotations

import torch

KINDS: tuple[str, ...] = ("cuda", "xpu", "mps", "cpu")  # best first


class DeviceError(RuntimeError):
    """A device that is unknown or not present on this machine."""


def is_available(kind: str) -> bool:
    """True when a device of this kind (cpu, cuda, xpu, mps) can be used here."""
    modules = {"cuda": torch.cuda, "xpu": torch.xpu, "mps": torch.backends.mps}
    return kind == "cpu" or (kind in modules and modules[kind].is_available())


def available_devices() -> list[str]:
    """Kinds of device present on this machine, best first (cpu is always last)."""
    return [kind for kind in KINDS if is_available(kind)]


def cuda_missing_reason() -> str:
    """Why ``cuda`` is unusable here, worded for the PyTorch build that is installed."""
    if torch.version.cuda is None:
        return (f"this PyTorch ({torch.__version__}) is a CPU-only build: install a CUDA build "
                "(see pytorch.org) on a machine with an NVIDIA GPU and its driver")
    return (f"this PyTorch ({torch.__version__}) is built for CUDA {torch.version.cuda}, but it finds no NVIDIA GPU "
            "(no GPU or driver here, or CUDA_VISIBLE_DEVICES hides them; `nvidia-smi` shows what the driver sees): "
            "run on a GPU machine")


def get_device(name: str | None = "auto") -> torch.device:
    """A ``torch.device`` for 'auto', 'cpu', 'cuda', 'cuda:1', 'xpu' or 'mps'; DeviceError says what to do if absent."""
    name = (name or "auto").strip().lower()
    if name == "auto":
        return torch.device(available_devices()[0])
    kind = name.split(":", 1)[0]
    if kind not in KINDS:
        raise DeviceError(f"Unknown device {name!r}. Use 'auto' or one of {', '.join(KINDS)} "
                          "(optionally with an index, e.g. 'cuda:1').")
    if not is_available(kind):
        hints = {"cuda": cuda_missing_reason(),
                 "xpu": "to use it, install PyTorch from the xpu wheel index and Intel's GPU driver (see chapter 12)",
                 "mps": "to use it, use an Apple-silicon Mac with a recent macOS"}
        raise DeviceError(f"Device {name!r} is not available on this machine "
                          f"(present: {', '.join(available_devices())}): {hints[kind]}; or pick 'auto'.")
    device = torch.device(name)
    count = getattr(torch, kind).device_count() if kind in ("cuda", "xpu") and device.index is not None else None
    if count is not None and device.index >= count:
        raise DeviceError(f"Device {name!r} does not exist: this machine has {count} {kind} device(s).")
    return device


def synchronize(device: torch.device | str) -> None:
    """Wait until all queued work on ``device`` has finished (no-op on the CPU)."""
    kind = torch.device(device).type
    if kind in ("cuda", "xpu"):
        getattr(torch, kind).synchronize(device)
    elif kind == "mps":
        torch.mps.synchronize()


def autocast_dtypes(device: torch.device | str) -> list[torch.dtype]:
    """Low-precision dtypes ``torch.autocast`` accepts on ``device`` (not: runs fast, ``system.cpu_bf16_support``)."""
    device = torch.device(device)
    if device.type == "cuda":
        return [torch.float16] + ([torch.bfloat16] if torch.cuda.is_bf16_supported() else [])
    if device.type == "xpu":
        return ([torch.bfloat16] if torch.xpu.is_bf16_supported() else []) + [torch.float16]
    return {"cpu": [torch.bfloat16, torch.float16], "mps": [torch.float16]}.get(device.type, [])


def low_precision_dtype(device: torch.device | str) -> torch.dtype:
    """The autocast dtype to train with: bfloat16 where ``device`` runs it (CUDA: natively, 8.0+), else float16."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported(including_emulation=False) else torch.float16
    return torch.bfloat16 if torch.bfloat16 in autocast_dtypes(device) else torch.float16


def grad_scaler_supported(device: torch.device | str) -> bool:
    """Whether ``torch.amp.GradScaler`` works on the device (it needs FP64 on xpu)."""
    device = torch.device(device)
    if device.type == "xpu":
        return bool(getattr(torch.xpu.get_device_properties(device), "has_fp64", False))
    return device.type in ("cuda", "cpu")


def describe(device: torch.device | str) -> str:
    """Human-readable name of the device, e.g. 'cuda:0 (NVIDIA H100)' or 'cpu'."""
    device = torch.device(device)
    if device.type in ("cuda", "xpu"):
        return f"{device} ({getattr(torch, device.type).get_device_name(device)})"
    return str(device)
