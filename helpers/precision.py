"""Number formats and mixed precision: bit layouts, underflow, TF32 switches.

``formats()`` tabulates FP64/FP32/TF32/FP16/BF16 from ``torch.finfo`` (TF32 is a math mode of
NVIDIA tensor cores, not a storage dtype, so its row is computed from its bit layout);
``underflow()`` shows which small gradient values survive a cast to each format, with and
without loss scaling; ``tf32`` switches TF32 matmuls and convolutions on or off as a context manager
(``tf32_defaults`` reads PyTorch's settings: convolutions default to TF32, matmuls do not);
``precision_bits`` and ``rounding_error`` show the other side of a format, its precision:
how far one value moves when it is rounded to the format.
"""

from __future__ import annotations

import contextlib
import math
from typing import Iterator, Sequence

import torch

from .tables import Table

# (name, dtype or None, exponent bits, mantissa (fraction) bits)
_FORMATS: tuple[tuple[str, torch.dtype | None, int, int], ...] = (
    ("FP64", torch.float64, 11, 52),
    ("FP32", torch.float32, 8, 23),
    ("TF32", None, 8, 10),
    ("FP16", torch.float16, 5, 10),
    ("BF16", torch.bfloat16, 8, 7),
)
_DTYPES = {"fp64": torch.float64, "fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
# Other spellings people (and torch) use for the same formats.
_ALIASES = {"float64": "fp64", "double": "fp64", "float32": "fp32", "float": "fp32", "float16": "fp16",
            "half": "fp16", "bfloat16": "bf16"}


def parse_dtype(name: str | torch.dtype | None) -> torch.dtype | None:
    """The autocast dtype for a name: 'fp32' -> None (no autocast); 'bf16' / 'fp16' -> the dtype.

    Accepts 'bf16', 'bfloat16', 'torch.bfloat16', 'fp16', 'float16', 'half', 'fp32',
    'float32' ... in any case. Clear error otherwise.
    """
    if name is None or isinstance(name, torch.dtype):
        return None if name in (None, torch.float32) else name
    key = name.strip().lower().removeprefix("torch.")
    key = _ALIASES.get(key, key)
    if key not in _DTYPES:
        raise ValueError(f"Unknown dtype {name!r}; choose one of fp32, bf16, fp16 (or bfloat16, float16, float32).")
    dtype = _DTYPES[key]
    return None if dtype == torch.float32 else dtype


def formats() -> Table:
    """Sign/exponent/fraction bits, bytes, machine epsilon, range and subnormal floor."""
    table = Table(["format", "exp bits", "fraction bits", "bytes", "eps", "max", "smallest normal", "smallest subnormal"],
                  note="TF32 is a tensor-core math mode (stored as FP32); its row follows from its 8+10 bit layout.")
    for name, dtype, e, m in _FORMATS:
        if dtype is not None:
            fi = torch.finfo(dtype)
            subnormal = fi.smallest_normal * fi.eps
            table.add(name, e, m, fi.bits // 8, fi.eps, fi.max, fi.smallest_normal, subnormal)
        else:  # derive from the layout (same exponent range as FP32)
            fi = torch.finfo(torch.float32)
            eps = 2.0 ** -m
            table.add(name, e, m, 4, eps, fi.max * (1 - 2.0 ** -(m + 1)) / (1 - 2.0 ** -24), fi.smallest_normal,
                      fi.smallest_normal * eps)
    return table


def underflow(values: Sequence[float] = (1e-3, 1e-5, 1e-7, 1e-8, 1e-10), scale: float = 2.0 ** 16) -> Table:
    """What small gradient values become in FP16/BF16, and in FP16 after loss scaling.

    Loss scaling multiplies the loss (and so every gradient) by ``scale`` before the cast
    and divides afterwards in FP32 -- what ``torch.amp.GradScaler`` automates.
    """
    table = Table(["value", "as FP16", "as BF16", f"FP16 scaled x{scale:g}, unscaled"],
                  note="0 means the gradient vanished: its update is lost.")
    for v in values:
        x = torch.tensor([v], dtype=torch.float32)
        fp16 = float(x.half())
        bf16 = float(x.bfloat16())
        scaled = float((x * scale).half().float() / scale)
        table.add(v, fp16, bf16, scaled)
    return table


def tf32_defaults() -> dict[str, str]:
    """This torch's TF32 settings as set now: ``{"matmul": ..., "conv": ...}`` (the ``fp32_precision`` API).

    PyTorch's defaults (2.9 and later): CUDA matmuls ``"none"`` (IEEE fp32 unless a parent setting
    says otherwise), cuDNN convolutions ``"tf32"``: an "fp32" training step on an Ampere or newer
    GPU already runs its convolutions in TF32 unless told otherwise.
    """
    return {"matmul": torch.backends.cuda.matmul.fp32_precision, "conv": torch.backends.cudnn.conv.fp32_precision}


@contextlib.contextmanager
def tf32(enabled: bool) -> Iterator[None]:
    """TF32 (``enabled``) or IEEE fp32 for CUDA matmuls *and* cuDNN convolutions inside the block.

    Uses the ``fp32_precision`` API (``torch.backends.cuda.matmul.fp32_precision``,
    ``torch.backends.cudnn.conv.fp32_precision``); the older ``allow_tf32`` flags are deprecated
    since torch 2.9, and reading them after the new API was used raises.
    """
    before = tf32_defaults()
    mode = "tf32" if enabled else "ieee"
    torch.backends.cuda.matmul.fp32_precision = mode
    torch.backends.cudnn.conv.fp32_precision = mode
    try:
        yield
    finally:
        torch.backends.cuda.matmul.fp32_precision = before["matmul"]
        torch.backends.cudnn.conv.fp32_precision = before["conv"]


def precision_bits(dtype: torch.dtype) -> int:
    """Bits of precision of a floating dtype: its stored fraction bits plus the implicit leading 1
    (FP32 24, FP16 11, BF16 8). Rounding to nearest moves a normal value by at most 2**-bits of it."""
    if not dtype.is_floating_point:
        raise ValueError(f"{dtype} is not a floating-point dtype")
    return 1 - round(math.log2(torch.finfo(dtype).eps))


def rounding_error(values: torch.Tensor, dtype: torch.dtype) -> float:
    """Median relative error |x - round(x)| / |x| when the non-zero ``values`` are cast to ``dtype``
    and back (values outside the format's range give inf or 1.0: pass values in range to see precision)."""
    x = values.detach().double().flatten()
    x = x[x != 0]
    if x.numel() == 0:
        raise ValueError("no non-zero values to round")
    return float(((x.to(dtype).double() - x).abs() / x.abs()).median())
