"""Guarded access to Intel Extension for PyTorch (IPEX) -- retired, used where the book does.

IPEX 2.8 is the final release (development stopped after 2.8; the repository is archived
and flagged as having known security issues). Its CPU build requires torch 2.8.* and, on a
version mismatch, its import prints an error and exits the process -- which would kill a
Jupyter kernel. So this module checks versions from package metadata *before* importing,
and checks the CPU before asking for bf16 weight prepacking (which asserts AVX-512 or
AVX-NE-CONVERT). Upstream replacements: ``torch.compile`` (Inductor) and
``torch.autocast('cpu', dtype=torch.bfloat16)`` on CPUs, native ``torch.xpu`` on Intel GPUs.
"""

from __future__ import annotations

import logging
import warnings
from importlib import metadata
from types import ModuleType

import torch

from . import system

RETIREMENT_NOTE = (
    "Intel Extension for PyTorch is retired: 2.8 is its last release, its repository is archived "
    "and flagged as having known security issues. Use it to reproduce the book; for new work use "
    "torch.compile, torch.autocast and native torch.xpu instead. The course runs without it: "
    "chapter 04 and the tuning search (chapter 13) skip their IPEX parts and say so."
)


class IPEXUnavailable(RuntimeError):
    """IPEX is missing, incompatible with this torch, or the CPU lacks a needed feature."""


def status() -> dict[str, object]:
    """Installed IPEX version, torch version and whether the two fit (no import of IPEX)."""
    try:
        version = metadata.version("intel-extension-for-pytorch")
    except metadata.PackageNotFoundError:
        return {"installed": None, "torch": torch.__version__, "compatible": False,
                "message": "IPEX is not installed (pip install intel-extension-for-pytorch==2.8.0, Linux x86-64)."}
    ipex_mm = version.split("+")[0].split(".")[:2]
    torch_mm = torch.__version__.split("+")[0].split(".")[:2]
    ok = ipex_mm == torch_mm
    message = "ok" if ok else (
        f"IPEX {version} needs torch {'.'.join(ipex_mm)}.* but torch {torch.__version__} is installed; "
        "importing it would end this Python process. Install matching versions (the course pins torch 2.8.0)."
    )
    return {"installed": version, "torch": torch.__version__, "compatible": ok, "message": message}


def advisory() -> str:
    """One line for setup checks: what is installed, whether it can be used, and the retirement note."""
    st = status()
    if st["installed"] is None:
        state = "IPEX is not installed"
    elif st["compatible"]:
        state = f"IPEX {st['installed']} is installed and matches torch {st['torch']}"
    else:
        state = f"IPEX {st['installed']} is installed but does not match torch {st['torch']} (not usable)"
    return f"{state}. {RETIREMENT_NOTE}"


def load() -> ModuleType:
    """Import IPEX after checking compatibility; raises IPEXUnavailable with what to do."""
    st = status()
    if not st["compatible"]:
        raise IPEXUnavailable(str(st["message"]))
    # IPEX 2.8 logs a deprecation notice for its fused-update options on every optimize()
    # (the retirement note says it all) and, on CUDA builds without a GPU, "No CUDA runtime".
    logging.getLogger("IPEX").setLevel(logging.ERROR)
    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import intel_extension_for_pytorch as ipex  # noqa: PLC0415
    return ipex


def bf16_prepack_supported() -> bool:
    """Whether this CPU can run IPEX's bf16 weight prepacking (AVX-512 BW/VL/DQ or AVX-NE-CONVERT)."""
    return bool(system.cpu_bf16_support()["ipex_bf16_prepack"])


def optimize(model: torch.nn.Module, optimizer: torch.optim.Optimizer, dtype: torch.dtype | None = None,
             **kwargs: object) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """``ipex.optimize`` for training: returns the (copied) model and optimizer to use.

    The model must be in train() mode. For ``dtype=torch.bfloat16`` the CPU is checked first.
    """
    if dtype == torch.bfloat16 and not bf16_prepack_supported():
        raise IPEXUnavailable(
            "IPEX bf16 training prepacks weights with AVX-512 (BW/VL/DQ) or AVX-NE-CONVERT instructions; "
            "this CPU has neither (AVX2 only). Use fp32 with IPEX, or torch.autocast('cpu', dtype=torch.bfloat16) "
            "(runs everywhere, fast only with AVX512-BF16/AMX)."
        )
    if not model.training:
        raise ValueError("call model.train() before optimizing for training (IPEX asserts it)")
    ipex = load()
    return ipex.optimize(model, optimizer=optimizer, dtype=dtype, **kwargs)
