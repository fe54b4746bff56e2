"""One device abstraction for cpu, cuda, xpu (Intel GPUs) and mps (Apple): ``get_device("auto")`` picks the
best present (cuda, xpu, mps, cpu), ``synchronize`` waits for queued work before a clock is read, and the
autocast questions every chapter asks of a device (``low_precision_dtype``, ``grad_scaler_supported``)."""

from __future__ import annotations

import torch

KNOWN_DEVICES: tuple[str, ...] = ("cpu", "cuda", "xpu", "mps")
_PREFERENCE: tuple[str, ...] = ("cuda", "xpu", "mps", "cpu")


class DeviceError(RuntimeError):
    """A device that is unknown or not present on this machine."""


def is_available(kind: str) -> bool:
    """True when a device of this kind (cpu, cuda, xpu, mps) can be used here."""
    if kind in ("xpu", "mps"):
        module = getattr(torch, "xpu", None) if kind == "xpu" else getattr(torch.backends, "mps", None)
        return module is not None and module.is_available()
    return kind == "cpu" or (kind == "cuda" and torch.cuda.is_available())


def available_devices() -> list[str]:
    """Kinds of device present on this machine, best first (cpu is always last)."""
    return [kind for kind in _PREFERENCE if is_available(kind)]


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
    if kind not in KNOWN_DEVICES:
        raise DeviceError(
            f"Unknown device {name!r}. Use 'auto' or one of {', '.join(KNOWN_DEVICES)} "
            "(optionally with an index, e.g. 'cuda:1')."
        )
    if not is_available(kind):
        hints = {
            "cuda": cuda_missing_reason(),
            "xpu": "to use it, install PyTorch from the xpu wheel index and Intel's GPU driver (see chapter 12)",
            "mps": "to use it, use an Apple-silicon Mac with a recent macOS",
        }
        raise DeviceError(
            f"Device {name!r} is not available on this machine "
            f"(present: {', '.join(available_devices())}): {hints[kind]}; or pick 'auto'."
        )
    device = torch.device(name)
    if device.index is not None:
        count = {"cuda": torch.cuda.device_count, "xpu": lambda: torch.xpu.device_count()}.get(kind)
        if count is not None and device.index >= count():
            raise DeviceError(f"Device {name!r} does not exist: this machine has {count()} {kind} device(s).")
    return device


def synchronize(device: torch.device | str) -> None:
    """Wait until all queued work on ``device`` has finished (no-op on the CPU)."""
    kind = torch.device(device).type
    if kind == "cuda":
        torch.cuda.synchronize(device)
    elif kind == "xpu":
        torch.xpu.synchronize(device)
    elif kind == "mps":
        torch.mps.synchronize()


def autocast_dtypes(device: torch.device | str) -> list[torch.dtype]:
    """Low-precision dtypes ``torch.autocast`` accepts on this device (accepted, not fast: ``system.cpu_bf16_support``)."""
    device = torch.device(device)
    if device.type == "cpu":
        return [torch.bfloat16, torch.float16]
    if device.type == "cuda":
        dtypes = [torch.float16]
        if torch.cuda.is_bf16_supported():
            dtypes.append(torch.bfloat16)
        return dtypes
    if device.type == "xpu":
        dtypes = [torch.bfloat16] if torch.xpu.is_bf16_supported() else []
        return dtypes + [torch.float16]
    if device.type == "mps":
        return [torch.float16]
    return []


def low_precision_dtype(device: torch.device | str) -> torch.dtype:
    """bfloat16 where ``device`` runs it (no ``GradScaler`` needed; on CUDA native only, 8.0 and newer; on any CPU,
    emulated without AVX-512-BF16/AMX), else float16 (which needs one): the autocast dtype to train with."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported(including_emulation=False) else torch.float16
    return torch.bfloat16 if torch.bfloat16 in autocast_dtypes(device) else torch.float16


def grad_scaler_supported(device: torch.device | str) -> bool:
    """Whether ``torch.amp.GradScaler`` works on the device (it needs FP64 on xpu)."""
    device = torch.device(device)
    if device.type == "cuda":
        return True
    if device.type == "xpu":
        props = torch.xpu.get_device_properties(device)
        return bool(getattr(props, "has_fp64", False))
    return device.type == "cpu"


def describe(device: torch.device | str) -> str:
    """Human-readable name of the device, e.g. 'cuda:0 (NVIDIA H100)' or 'cpu'."""
    device = torch.device(device)
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    if device.type == "xpu":
        return f"{device} ({torch.xpu.get_device_name(device)})"
    return str(device)
