"""Number formats and mixed precision: dtype names, precision bits and rounding error, TF32 switches, and chapter
07's harness (oneDNN's formats on this CPU, flushed gradients, timed rounds, profiler rows per operator and shape,
speed-ups beside published ones).
"""

from __future__ import annotations

import contextlib
import math
import time
from typing import Any, Iterator, Mapping, Sequence

import torch

from .seeds import set_seed
from .tables import Table

_DTYPES = {"fp64": torch.float64, "fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def parse_dtype(name: str | torch.dtype | None) -> torch.dtype | None:
    """The autocast dtype for a name in any spelling ('bf16', 'torch.bfloat16', 'half', ...): fp32 -> None."""
    if name is None or isinstance(name, torch.dtype):
        return None if name in (None, torch.float32) else name
    key = name.strip().lower().removeprefix("torch.")
    dtype = _DTYPES.get(key, getattr(torch, key, None))  # else torch's own names: bfloat16, half, double, ...
    if dtype not in _DTYPES.values():
        raise ValueError(f"Unknown dtype {name!r}; choose one of fp32, bf16, fp16 (or bfloat16, float16, float32).")
    return None if dtype == torch.float32 else dtype


@contextlib.contextmanager
def tf32(enabled: bool) -> Iterator[None]:
    """TF32 (``enabled``) or IEEE fp32 for CUDA matmuls and cuDNN convolutions inside the block (``fp32_precision``)."""
    switches = (torch.backends.cuda.matmul, torch.backends.cudnn.conv)
    before = [s.fp32_precision for s in switches]
    for s in switches:
        s.fp32_precision = "tf32" if enabled else "ieee"
    try:
        yield
    finally:
        for s, mode in zip(switches, before):
            s.fp32_precision = mode


def precision_bits(dtype: torch.dtype) -> int:
    """Bits of precision of a floating dtype: fraction bits plus the implicit leading 1 (FP32 24, FP16 11, BF16 8)."""
    if not dtype.is_floating_point:
        raise ValueError(f"{dtype} is not a floating-point dtype")
    return 1 - round(math.log2(torch.finfo(dtype).eps))


def rounding_error(values: torch.Tensor, dtype: torch.dtype) -> float:
    """Median relative error |x - round(x)| / |x| when the non-zero ``values`` are cast to ``dtype`` and back."""
    x = values.detach().double().flatten()
    x = x[x != 0]
    if x.numel() == 0:
        raise ValueError("no non-zero values to round")
    return float(((x.to(dtype).double() - x).abs() / x.abs()).median())


def onednn_formats() -> dict[str, bool | None]:
    """Whether PyTorch hands BF16 / FP16 to oneDNN on this CPU (its own private check): ``{"bf16", "fp16"}``, None
    when this build cannot say; where False, generic (slow) kernels run."""
    found: dict[str, bool | None] = {}
    for fmt in ("bf16", "fp16"):
        try:
            found[fmt] = bool(getattr(torch.ops.mkldnn, f"_is_mkldnn_{fmt}_supported")())
        except Exception:  # a build without oneDNN, or the op renamed: unknown
            found[fmt] = None
    return found


def flush_table(reference: torch.Tensor, grads: Mapping[str, torch.Tensor], *, lr: float = 0.01,
                title: str = "") -> Table:
    """Per gradient variant: elements flushed to 0 (non-zero in FP32 ``reference``), zero SGD updates, update error."""
    alive = reference != 0
    n_alive = int(alive.sum())
    if n_alive == 0:
        raise ValueError("the reference gradient has no non-zero element")
    update32 = -lr * reference
    table = Table(["gradients", "non-zero in FP32", "flushed to 0", "flushed %", "weights not updated",
                   "update error vs FP32 %"], title=title)
    for name, g in grads.items():
        lost, update = int((alive & (g == 0)).sum()), -lr * g
        table.add(name, n_alive, lost, 100 * lost / n_alive, int((alive & (update == 0)).sum()),
                  100 * float((update - update32).norm() / update32.norm()))
    return table


def shapes_text(shapes: Sequence[Sequence[int]]) -> str:
    """Profiler input shapes as "[32, 512] x [512, 4096]" (empty shapes left out, "-" when none)."""
    return " x ".join(str(list(s)) for s in shapes if s) or "-"


def op_table(ops: Mapping[str, Mapping[Any, tuple[float, Any]]], model: torch.nn.Module, *, slow: str = "fp16",
             base: str = "fp32", top: int = 8) -> tuple[Table, list]:
    """The ``top`` rows of the ``slow`` format's profile beside ``base``'s (``ops[fmt]``: (operator, shapes) -> (ms,
    shapes)), matmuls named by layer: the table and its row keys, slowest first."""
    from .profiling import matmul_owner

    ms = {fmt: {k: v[0] for k, v in found.items()} for fmt, found in ops.items()}
    keys = sorted(ms[slow], key=ms[slow].get, reverse=True)[:top]
    total = sum(ms[slow].values()) or 1.0
    table = Table(["operator", "input shapes", f"{base} ms", f"{slow} ms", f"{slow} share %",
                   "layer (from the shapes)"],
                  title=f"Self CPU time per operator and input shapes, one step (the {slow.upper()} step's top {top})",
                  note=f"{base} ms '-': {base.upper()} never called this operator with these shapes")
    for k in keys:
        shapes = ops[slow][k][1]
        layer = matmul_owner(model, shapes) if k[0] in ("aten::mm", "aten::addmm") else None
        table.add(k[0], shapes_text(shapes), ms[base].get(k), ms[slow][k], 100 * ms[slow][k] / total, layer or "-")
    return table, keys


def vs_published(res: Any, published: Mapping[str, float], *, where: str, source: str, baseline: str = "fp32",
                 what: str = "book (A100, EfficientNet)") -> Table:
    """Speed-ups over ``baseline`` from rounds ``res`` beside the ``published`` times (s per variant): a table, and a
    figure on a log axis drawn on the current matplotlib backend."""
    import matplotlib.pyplot as plt

    from .measure import aa_name

    names = [n for n in res.names if n != aa_name(baseline)]
    v = {n: res.verdict(n, baseline) for n in names if n != baseline}
    pub = {n: published[baseline] / published[n] for n in names if n in published and baseline in published}
    table = Table(["variant", "published time s", "published speed-up (x)", "your speed-up (x)", "95% interval (x)",
                   "verdict"], title=f"Speed-up over {baseline.upper()}: {what} vs yours ({where})",
                  note=f"Published: {source}. Yours: the rounds above.")
    for n in names:
        table.add(n, published.get(n), pub.get(n),
                  *((v[n].ratio, v[n].interval, v[n].label) if n in v else (1.0, "-", "baseline")))
    r = [(v[n].low, v[n].ratio, v[n].high) if n in v else (1.0, 1.0, 1.0) for n in names]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.bar([i - 0.2 for i in range(len(names))], [m for _, m, _ in r], 0.4, capsize=4, label="yours (95% interval)",
           yerr=[[max(m - lo, 0.0) for lo, m, _ in r], [max(hi - m, 0.0) for _, m, hi in r]])  # no interval: 0
    ax.bar([i + 0.2 for i in range(len(names))], [pub.get(n, 0) for n in names], 0.4,
           label=f"{what}, one run each", alpha=0.7)
    ax.axhline(1, color="grey", lw=0.8)
    ax.set_xticks(range(len(names)), names)
    ax.set_yscale("log")
    ax.set_ylabel(f"speed-up vs {baseline} (x)")
    ax.set_title(f"Mixed precision: {where} vs the book")
    ax.legend(fontsize=8)
    return table


def step_round(model_fn: Any, step: Any, batches: Sequence[tuple[torch.Tensor, torch.Tensor]], *,
               dtype: torch.dtype | None, min_steps: int = 1, seed: int = 0, lr: float = 1e-3) -> Any:
    """One round for ``measure.interleaved``: a fresh model, Adam and GradScaler (FP16), one warm-up ``step`` (the
    chapter's ``amp_step``), then timed steps until the sample is long enough -> (ms per step, {"timed steps"})."""
    from .measure import sample_long_enough

    if len(batches) < 2:
        raise ValueError("step_round needs a warm-up batch and at least one batch to time")

    def one_round() -> tuple[float, dict[str, int]]:
        set_seed(seed)
        model = model_fn()
        opt = torch.optim.Adam(model.parameters(), lr=lr)
        scaler = torch.amp.GradScaler(batches[0][0].device.type, enabled=(dtype == torch.float16))
        step(model, opt, scaler, *batches[0], dtype=dtype)             # warm-up, untimed
        n, start = 0, time.perf_counter()
        while n < min_steps or not sample_long_enough(n, time.perf_counter() - start):
            step(model, opt, scaler, *batches[1 + n % (len(batches) - 1)], dtype=dtype)
            n += 1
        return 1000 * (time.perf_counter() - start) / n, {"timed steps": n}

    return one_round


def op_summary(ops: Mapping[str, Mapping[Any, tuple[float, Any]]], model: torch.nn.Module, key: Any, *,
               slow: str = "fp16", base: str = "fp32") -> list[str]:
    """Lines under ``op_table``: total operator times, the generic convolutions' share, and for a matmul ``key`` of a
    known layer its GFLOP/s in both formats."""
    from .profiling import matmul_owner

    ms = {fmt: {k: v[0] for k, v in found.items()} for fmt, found in ops.items()}
    slow_conv = sum(v for k, v in ms[slow].items() if "slow_conv" in k[0])
    lines = [f"all operators: {base} {sum(ms[base].values()):.0f} ms, {slow} {sum(ms[slow].values()):.0f} ms; "
             f"generic {slow.upper()} convolutions (aten::_slow_conv2d_*): {slow_conv:.0f} ms"]
    top_ms, shapes = ops[slow][key]
    layer = matmul_owner(model, shapes) if key[0] in ("aten::mm", "aten::addmm") else None
    mats = [s for s in shapes if len(s) == 2]
    if layer and key in ms[base] and len(mats) == 2:
        flop = 2 * mats[0][0] * mats[0][1] * mats[1][1]
        lines.append(f"top row, {layer}: {flop / 1e6:.0f} MFLOP at {flop / top_ms / 1e6:.2f} GFLOP/s in "
                     f"{slow.upper()}, {flop / ms[base][key] / 1e6:.1f} GFLOP/s in {base.upper()}")
    return lines
