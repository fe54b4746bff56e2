"""Structured pruning: an L1-norm rule picks the filters to drop (NNI 3.0's ``L1NormPruner`` where NNI installs,
else the same rule from Torch-Pruning: ``mask_source``), Torch-Pruning removes them (NNI's own ``ModelSpeedup``
fails on torch >= 2.2: chapter 06). ``prune_round_to`` is Torch-Pruning alone, keeping a multiple of k filters;
``zeros_pct`` and ``timed_steps`` are chapter 06's timing harness.
"""

from __future__ import annotations

import copy
import time
import warnings
from dataclasses import dataclass
from importlib import metadata
from typing import Any, Callable, Sequence

import torch
from torch import nn

from .seeds import set_seed
from .step import train_step


class PruningError(ValueError):
    """Bad pruning input (sparsity out of range, no prunable layer)."""


def check_sparsity(sparsity: float) -> float:
    """Return ``sparsity`` if it is a fraction strictly between 0 and 1, else raise PruningError."""
    if not isinstance(sparsity, (int, float)) or not 0.0 < float(sparsity) < 1.0:
        raise PruningError("sparsity must be a fraction between 0 and 1 (exclusive), e.g. 0.5 for 50%; "
                           f"got {sparsity!r}")
    return float(sparsity)


def nni_available() -> bool:
    """True when NNI's pruners can be imported here (NNI 3.0 has wheels for x86-64 only)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import nni.compression.pruning  # noqa: F401
    except ImportError:
        return False
    return True


def mask_source(source: str = "auto") -> str:
    """Which code computes the L1-norm masks: ``"nni"`` or ``"torch"`` (``"auto"``: NNI where it imports)."""
    if source == "auto":
        return "nni" if nni_available() else "torch"
    if source in ("nni", "torch"):
        return source
    raise PruningError(f"mask source must be 'auto', 'nni' or 'torch'; got {source!r}")


def describe_mask_source(source: str) -> str:
    """One line naming the code behind ``source`` ("nni" or "torch") and, for "torch", why it runs."""
    if mask_source(source) == "nni":
        return f"NNI {metadata.version('nni')} L1NormPruner"
    why = ("chosen, NNI is installed too" if nni_available() else
           "NNI is not installed on this platform (its wheels are for x86-64 only)")
    return f"Torch-Pruning MagnitudeImportance(p=1), the same L1-norm rule: {why}"


def nni_l1_masks(model: nn.Module, sparsity: float) -> dict[str, dict[str, torch.Tensor]]:
    """NNI's L1NormPruner masks of every Conv2d, ``{layer: {'weight': mask, 'bias': mask}}``; the model unchanged."""
    sparsity = check_sparsity(sparsity)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from nni.compression.pruning import L1NormPruner
    except ImportError as exc:
        raise ImportError(f"NNI is not importable ({exc}; its wheels are for x86-64 only): `torch_l1_masks` or "
                          "`prune(..., source='torch')` applies the same L1-norm rule.") from None
    _convs(model)
    pruner = L1NormPruner(model, [{"op_types": ["Conv2d"], "sparse_ratio": sparsity}])
    _, masks = pruner.compress()
    pruner.unwrap_model()
    return {name: {k: v.detach().clone() for k, v in m.items()} for name, m in masks.items()}


def torch_l1_masks(model: nn.Module, sparsity: float,
                   example_inputs: torch.Tensor) -> dict[str, dict[str, torch.Tensor]]:
    """NNI's L1-norm rule from Torch-Pruning (``group_reduction="first"``: each layer's own filters, as NNI ranks
    them): masks in ``nni_l1_masks``'s format, the ``int(filters * sparsity)`` smallest zeroed per Conv2d."""
    import torch_pruning as tp

    sparsity = check_sparsity(sparsity)
    l1 = tp.importance.MagnitudeImportance(p=1, group_reduction="first", normalizer=None)
    masks = {}
    with torch.enable_grad():  # the dependency graph is traced through autograd
        graph = tp.DependencyGraph().build_dependency(model, example_inputs=example_inputs)
        for name, conv in _convs(model).items():
            group = graph.get_pruning_group(conv, tp.prune_conv_out_channels, idxs=list(range(conv.out_channels)))
            keep = torch.ones(conv.out_channels, dtype=conv.weight.dtype, device=conv.weight.device)
            keep[l1(group).topk(int(conv.out_channels * sparsity), largest=False).indices] = 0.0
            masks[name] = {"weight": keep.view(-1, 1, 1, 1).expand_as(conv.weight).clone()}
            if conv.bias is not None:
                masks[name]["bias"] = keep.clone()
    return masks


def _convs(model: nn.Module) -> dict[str, nn.Conv2d]:
    convs = {n: m for n, m in model.named_modules() if isinstance(m, nn.Conv2d)}
    if not convs:
        raise PruningError("the model has no layer of type Conv2d to prune")
    return convs


def zeroed_channels(masks: dict[str, dict[str, torch.Tensor]]) -> dict[str, list[int]]:
    """Output channels whose weight mask is entirely zero, per layer."""
    return {name: [i for i, row in enumerate(m["weight"].flatten(1)) if not row.any()] for name, m in masks.items()}


@dataclass(frozen=True)
class PruneReport:
    """Filters per pruned layer before and after."""

    channels_before: dict[str, int]
    channels_after: dict[str, int]


def prune(model: nn.Module, sparsity: float, example_inputs: torch.Tensor, source: str = "auto") -> PruneReport:
    """L1-norm masks at ``sparsity`` for every Conv2d (from ``mask_source(source)``), then Torch-Pruning removes the
    masked filters and what depends on them, in place: make the optimizer after this."""
    import torch_pruning as tp

    sparsity = check_sparsity(sparsity)
    masks = nni_l1_masks(model, sparsity) if mask_source(source) == "nni" else \
        torch_l1_masks(model, sparsity, example_inputs)
    convs = {n: m for n, m in _convs(model).items() if n in masks}
    before = {n: m.out_channels for n, m in convs.items()}
    with torch.enable_grad():  # the dependency graph is traced through autograd
        graph = tp.DependencyGraph().build_dependency(model, example_inputs=example_inputs)
        for name, idxs in zeroed_channels(masks).items():
            if idxs:
                graph.get_pruning_group(convs[name], tp.prune_conv_out_channels, idxs=idxs).prune()
    return PruneReport(before, {n: m.out_channels for n, m in convs.items()})


def try_nni_speedup(model: nn.Module, masks: dict[str, dict[str, torch.Tensor]],
                    example_inputs: torch.Tensor) -> str:
    """Run NNI's own ModelSpeedup on a copy of the model: 'ok' or the error it raises (why Torch-Pruning)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from nni.compression.speedup import ModelSpeedup

            ModelSpeedup(copy.deepcopy(model), example_inputs, masks).speedup_model()
    except Exception as exc:  # we want to show whatever NNI raises
        return f"{type(exc).__name__}: {exc}"
    return "ok"


def kept_channels(channels: int, sparsity: float, round_to: int | None = None) -> int:
    """Filters ``MetaPruner`` keeps of ``channels``: ``int(channels * (1 - sparsity))``, rounded down to a multiple of
    ``round_to`` (26 -> 24 with 8; below k: 0, which MetaPruner refuses)."""
    sparsity = check_sparsity(sparsity)
    if round_to is not None and round_to < 1:
        raise PruningError(f"round_to must be a positive multiple, e.g. 8; got {round_to!r}")
    keep = int(channels * (1 - sparsity))
    return keep - keep % round_to if round_to else keep


def prune_round_to(model: nn.Module, sparsity: float, example_inputs: torch.Tensor, *,
                   round_to: int | None = 8) -> PruneReport:
    """Torch-Pruning alone: every Conv2d's filters by the L1 norm of their coupled group, ``MetaPruner(round_to=...)``
    (the counts ``kept_channels`` says); PruningError, before any change, when a layer would keep no filter."""
    import torch_pruning as tp

    sparsity = check_sparsity(sparsity)
    convs = _convs(model)
    ch_before = {n: m.out_channels for n, m in convs.items()}
    target = {n: kept_channels(c, sparsity, round_to) for n, c in ch_before.items()}
    empty = [f"{n} ({ch_before[n]} filters -> {k})" for n, k in target.items() if k < 1]
    if empty:
        raise PruningError(f"round_to={round_to} at {sparsity:.0%} would leave no filter in "
                           f"{', '.join(empty)}: choose a lower sparsity or a smaller round_to")
    ignored = [m for m in model.modules() if isinstance(m, nn.Linear)]
    with torch.enable_grad():  # the dependency graph is traced through autograd
        pruner = tp.pruner.MetaPruner(model, example_inputs, importance=tp.importance.MagnitudeImportance(p=1),
                                      pruning_ratio=sparsity, round_to=round_to, ignored_layers=ignored)
        pruner.step()
    ch_after = {n: m.out_channels for n, m in convs.items()}
    if ch_after != target:  # the contract above; a newer Torch-Pruning that rounds otherwise must not go unnoticed
        raise PruningError(f"Torch-Pruning kept {ch_after} filters, expected {target}")
    return PruneReport(ch_before, ch_after)


def zeros_pct(model: nn.Module, modules: Sequence[nn.Module], example_inputs: torch.Tensor) -> float:
    """Share (%) of zeros in the ``weight`` of ``modules`` after one forward pass (``nn.utils.prune`` hooks apply)."""
    if not modules:
        raise PruningError("zeros_pct needs at least one module with a weight")
    with torch.no_grad():
        model(example_inputs)
    weights = [m.weight for m in modules]
    return 100.0 * sum(int((w == 0).sum()) for w in weights) / sum(w.numel() for w in weights)


def timed_steps(build: Callable[[], nn.Module], batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
                make_optimizer: Callable[[Any], torch.optim.Optimizer], loss_fn: Callable, *, warmup: int = 2,
                zeros_of: Callable[[nn.Module], float] | None = None, seed: int = 0,
                **facts: Any) -> Callable[[], tuple[float, dict[str, Any]]]:
    """One round of one arm for ``measure.interleaved``: a fresh model and optimizer, ``warmup`` untimed steps, the
    other batches timed -> ``(s per step, facts)``; ``zeros_of(model)`` adds ``zeros_before``/``zeros_after``."""
    if not 0 <= warmup < len(batches):
        raise PruningError(f"{len(batches)} batches leave none to time after {warmup} warm-up steps")

    def one_round() -> tuple[float, dict[str, Any]]:
        set_seed(seed)
        model = build()
        optimizer = make_optimizer(model.parameters())
        for inputs, targets in batches[:warmup]:
            train_step(model, optimizer, loss_fn, inputs, targets)
        extra = {"zeros_before": zeros_of(model)} if zeros_of else {}
        start = time.perf_counter()
        for inputs, targets in batches[warmup:]:
            train_step(model, optimizer, loss_fn, inputs, targets)
        took = (time.perf_counter() - start) / (len(batches) - warmup)
        if zeros_of:
            extra["zeros_after"] = zeros_of(model)
        return took, {**facts, **extra}
    return one_round
