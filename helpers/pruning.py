"""Structured pruning: an L1-norm rule computes which filters to drop, Torch-Pruning removes them.

The masks come from NNI 3.0's ``L1NormPruner`` where NNI installs (it has wheels for x86-64 only:
Linux, Windows, Intel macOS). On Apple Silicon and ARM Linux, where NNI is absent, the same rule
runs from stock code: Torch-Pruning's ``MagnitudeImportance(p=1, group_reduction="first")`` (the L1
norm of each filter of the layer itself), dropping the ``int(filters * sparsity)`` smallest per
layer as NNI does. ``mask_source`` says which one runs (``"nni"`` or ``"torch"``; ``source="torch"``
forces the stock rule), ``describe_mask_source`` says it in words, and ``prune``'s report records it.

NNI 3.0 (archived) still computes masks on current PyTorch, but its own ``ModelSpeedup`` -- the step
that physically shrinks the model -- fails on torch >= 2.2. So the course splits the job: the masks
say which output channels of each Conv2d are zero; Torch-Pruning's dependency graph removes exactly
those channels and everything coupled to them (the next layer's input channels, the flattened
Linear inputs).

``prune_round_to`` is the other route, Torch-Pruning alone: its ``MetaPruner`` ranks the filters
by L1 norm and, with ``round_to=k``, keeps a multiple of k filters per layer (``kept_channels``
says how many), the channel counts that vectorised convolution kernels handle best.

``zeros_pct`` and ``timed_steps`` are chapter 06's timing harness: the share of zero weights a
forward pass uses, and one round of one arm (a fresh model and optimizer, untimed warm-up steps,
then timed training steps) for ``measure.interleaved``.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from importlib import metadata
from typing import Any, Callable, Literal, Sequence

import torch
from torch import nn

from .models import count_parameters
from .seeds import set_seed
from .step import train_step


class PruningError(ValueError):
    """Bad pruning input (sparsity out of range, no prunable layer)."""


def check_sparsity(sparsity: float) -> float:
    """Return ``sparsity`` if it is a fraction strictly between 0 and 1, else raise PruningError."""
    if not isinstance(sparsity, (int, float)) or not 0.0 < float(sparsity) < 1.0:
        raise PruningError(
            f"sparsity must be a fraction between 0 and 1 (exclusive), e.g. 0.5 for 50%; got {sparsity!r}"
        )
    return float(sparsity)


MaskSource = Literal["nni", "torch"]


def nni_available() -> bool:
    """True when NNI's pruners can be imported here (NNI 3.0 has wheels for x86-64 only)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import nni.compression.pruning  # noqa: F401
    except ImportError:
        return False
    return True


def mask_source(source: str = "auto") -> MaskSource:
    """Which code computes the L1-norm masks: ``"nni"`` or ``"torch"``.

    ``"auto"`` gives ``"nni"`` where NNI can be imported and ``"torch"`` (Torch-Pruning's
    magnitude importance, the same rule) elsewhere; ``"nni"`` and ``"torch"`` force that one.
    """
    if source == "auto":
        return "nni" if nni_available() else "torch"
    if source in ("nni", "torch"):
        return source  # type: ignore[return-value]
    raise PruningError(f"mask source must be 'auto', 'nni' or 'torch'; got {source!r}")


def describe_mask_source(source: str) -> str:
    """One line naming the code behind ``source`` ("nni" or "torch") and, for "torch", why it runs."""
    if mask_source(source) == "nni":
        try:
            return f"NNI {metadata.version('nni')} L1NormPruner"
        except metadata.PackageNotFoundError:
            return "NNI L1NormPruner (NNI is not installed: computing the masks will fail)"
    why = ("chosen, NNI is installed too" if nni_available() else
           "NNI is not installed on this platform (its wheels are for x86-64 only)")
    return f"Torch-Pruning MagnitudeImportance(p=1), the same L1-norm rule: {why}"


def nni_l1_masks(model: nn.Module, sparsity: float,
                 op_types: Sequence[str] = ("Conv2d",)) -> dict[str, dict[str, torch.Tensor]]:
    """NNI's L1NormPruner masks: ``{layer name: {'weight': mask, 'bias': mask}}``.

    The model is left unwrapped and its weights unchanged; only the masks are returned.
    """
    sparsity = check_sparsity(sparsity)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from nni.compression.pruning import L1NormPruner
    except ImportError as exc:
        raise ImportError(
            f"NNI is not importable ({exc}). NNI 3.0 has wheels for x86-64 only: there, install the course "
            "environment (`make setup`) or `pip install nni==3.0`; elsewhere `torch_l1_masks` (or "
            "`prune(..., source='torch')`) applies the same L1-norm rule."
        ) from None
    if not any(type(m).__name__ in op_types for m in model.modules()):
        raise PruningError(f"the model has no layer of type {', '.join(op_types)} to prune")
    pruner = L1NormPruner(model, [{"op_types": list(op_types), "sparse_ratio": sparsity}])
    _, masks = pruner.compress()
    pruner.unwrap_model()
    return {name: {k: v.detach().clone() for k, v in m.items()} for name, m in masks.items()}


def torch_l1_masks(model: nn.Module, sparsity: float, example_inputs: torch.Tensor,
                   op_types: Sequence[str] = ("Conv2d",)) -> dict[str, dict[str, torch.Tensor]]:
    """NNI's L1-norm rule without NNI, from Torch-Pruning: masks in ``nni_l1_masks``'s format.

    For each Conv2d (or Linear) whose type is in ``op_types``, the ``int(filters * sparsity)``
    output channels with the smallest L1 norm of their weights get a zero mask (weight and bias),
    layer by layer, as NNI's ``L1NormPruner`` does. The norms come from
    ``MagnitudeImportance(p=1, group_reduction="first", normalizer=None)``: the first entry of a
    pruning group is the layer's own filters, so the coupled layers do not enter the ranking
    (unlike ``prune_round_to``). The model's weights are left unchanged.
    """
    import torch_pruning as tp

    sparsity = check_sparsity(sparsity)
    layers = {n: m for n, m in model.named_modules() if type(m).__name__ in op_types}
    if not layers:
        raise PruningError(f"the model has no layer of type {', '.join(op_types)} to prune")
    handlers = {nn.Conv2d: tp.prune_conv_out_channels, nn.Linear: tp.prune_linear_out_channels}
    unsupported = sorted({type(m).__name__ for m in layers.values() if type(m) not in handlers})
    if unsupported:
        raise PruningError(f"the Torch-Pruning mask rule handles Conv2d and Linear layers, not {', '.join(unsupported)}")
    l1 = tp.importance.MagnitudeImportance(p=1, group_reduction="first", normalizer=None)
    masks = {}
    with torch.enable_grad():  # the dependency graph is traced through autograd
        graph = tp.DependencyGraph().build_dependency(model, example_inputs=example_inputs)
        for name, module in layers.items():
            filters = module.weight.shape[0]
            group = graph.get_pruning_group(module, handlers[type(module)], idxs=list(range(filters)))
            norms = l1(group)
            keep = torch.ones(filters, dtype=module.weight.dtype, device=module.weight.device)
            keep[norms.topk(int(filters * sparsity), largest=False).indices] = 0.0
            masks[name] = {"weight": keep.view(-1, *[1] * (module.weight.dim() - 1)).expand_as(module.weight).clone()}
            if module.bias is not None:
                masks[name]["bias"] = keep.clone()
    return masks


def zeroed_channels(masks: dict[str, dict[str, torch.Tensor]]) -> dict[str, list[int]]:
    """Output channels whose weight mask is entirely zero, per layer."""
    out = {}
    for name, m in masks.items():
        w = m["weight"]
        flat = w.reshape(w.shape[0], -1)
        out[name] = [i for i in range(w.shape[0]) if not bool(flat[i].any())]
    return out


def remove_channels(model: nn.Module, channels: dict[str, list[int]], example_inputs: torch.Tensor) -> nn.Module:
    """Physically remove the given output channels (and what depends on them), in place.

    Parameters are replaced by smaller tensors: create the optimizer *after* this call.
    """
    import torch_pruning as tp

    modules = dict(model.named_modules())
    missing = sorted(set(channels) - set(modules))
    if missing:
        raise PruningError(f"no layer named {', '.join(missing)} in the model")
    with torch.enable_grad():  # the dependency graph is traced through autograd
        graph = tp.DependencyGraph().build_dependency(model, example_inputs=example_inputs)
        for name, idxs in channels.items():
            module = modules[name]
            if not idxs:
                continue
            if len(idxs) >= module.weight.shape[0]:
                raise PruningError(f"cannot remove all {module.weight.shape[0]} channels of {name}")
            fn = tp.prune_conv_out_channels if isinstance(module, nn.Conv2d) else tp.prune_linear_out_channels
            graph.get_pruning_group(module, fn, idxs=list(idxs)).prune()
    return model


@dataclass(frozen=True)
class PruneReport:
    """Parameter counts and channel counts before and after pruning."""

    sparsity: float
    params_before: int
    params_after: int
    channels_before: dict[str, int]
    channels_after: dict[str, int]
    mask_source: MaskSource | None = None  # "nni" or "torch" from ``prune``; None from ``prune_round_to``

    @property
    def reduction(self) -> float:
        return 1.0 - self.params_after / self.params_before


def prune(model: nn.Module, sparsity: float, example_inputs: torch.Tensor,
          op_types: Sequence[str] = ("Conv2d",), source: str = "auto") -> PruneReport:
    """L1-norm masks at ``sparsity`` for every ``op_types`` layer, then physical removal.

    The masks come from NNI where it is installed, else from Torch-Pruning (``mask_source``);
    ``source="nni"`` or ``"torch"`` forces one. The report's ``mask_source`` says which ran.
    """
    sparsity = check_sparsity(sparsity)
    source = mask_source(source)
    before = count_parameters(model)
    if source == "nni":
        masks = nni_l1_masks(model, sparsity, op_types)
    else:
        masks = torch_l1_masks(model, sparsity, example_inputs, op_types)
    modules = dict(model.named_modules())
    names = [n for n in modules if n in masks]  # the model's order, whichever order the masks came in
    ch_before = {n: modules[n].weight.shape[0] for n in names}
    remove_channels(model, zeroed_channels(masks), example_inputs)
    modules = dict(model.named_modules())
    ch_after = {n: modules[n].weight.shape[0] for n in names}
    return PruneReport(sparsity, before, count_parameters(model), ch_before, ch_after, source)


def try_nni_speedup(model: nn.Module, masks: dict[str, dict[str, torch.Tensor]],
                    example_inputs: torch.Tensor) -> str:
    """Run NNI's own ModelSpeedup on a copy of the model; return 'ok' or the error it raises.

    Kept to show, on the learner's machine, why the course uses Torch-Pruning instead.
    """
    import copy

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from nni.compression.speedup import ModelSpeedup

            ModelSpeedup(copy.deepcopy(model), example_inputs, masks).speedup_model()
    except Exception as exc:  # we want to show whatever NNI raises
        return f"{type(exc).__name__}: {exc}"
    return "ok"


def kept_channels(channels: int, sparsity: float, round_to: int | None = None) -> int:
    """Filters Torch-Pruning's ``MetaPruner`` keeps of ``channels`` at ``sparsity`` (local pruning).

    It keeps ``int(channels * (1 - sparsity))``; with ``round_to=k`` that number rounded *down*
    to a multiple of k (so 26 -> 24 with k=8; a count below k becomes 0, which MetaPruner then
    refuses to apply).
    """
    sparsity = check_sparsity(sparsity)
    if channels < 1:
        raise PruningError(f"channels must be a positive count; got {channels!r}")
    if round_to is not None and round_to < 1:
        raise PruningError(f"round_to must be a positive multiple, e.g. 8; got {round_to!r}")
    keep = int(channels * (1 - sparsity))
    return keep - keep % round_to if round_to else keep


def prune_round_to(model: nn.Module, sparsity: float, example_inputs: torch.Tensor, *,
                   round_to: int | None = 8) -> PruneReport:
    """Torch-Pruning alone: L1-norm filter pruning of every Conv2d with ``MetaPruner(round_to=...)``.

    The Linear layers are not pruned as roots (as with ``prune``), only their inputs follow the
    removed filters. Raises PruningError, before touching the model, when rounding would leave a
    layer with no filter. Note that MetaPruner ranks a filter by the L1 norm of the whole group
    it couples (the filter and the next layer's matching inputs), so it may keep other filters
    than NNI's per-layer ranking; the channel counts are what ``kept_channels`` says.
    """
    import torch_pruning as tp

    sparsity = check_sparsity(sparsity)
    convs = {n: m for n, m in model.named_modules() if isinstance(m, nn.Conv2d)}
    if not convs:
        raise PruningError("the model has no layer of type Conv2d to prune")
    ch_before = {n: m.out_channels for n, m in convs.items()}
    target = {n: kept_channels(c, sparsity, round_to) for n, c in ch_before.items()}
    empty = [f"{n} ({ch_before[n]} filters -> {k})" for n, k in target.items() if k < 1]
    if empty:
        raise PruningError(f"round_to={round_to} at {sparsity:.0%} would leave no filter in "
                           f"{', '.join(empty)}: choose a lower sparsity or a smaller round_to")
    before = count_parameters(model)
    ignored = [m for m in model.modules() if isinstance(m, nn.Linear)]
    with torch.enable_grad():  # the dependency graph is traced through autograd
        pruner = tp.pruner.MetaPruner(model, example_inputs, importance=tp.importance.MagnitudeImportance(p=1),
                                      pruning_ratio=sparsity, round_to=round_to, ignored_layers=ignored)
        pruner.step()
    ch_after = {n: m.out_channels for n, m in convs.items()}
    if ch_after != target:  # the contract above; a newer Torch-Pruning that rounds otherwise must not go unnoticed
        raise PruningError(f"Torch-Pruning kept {ch_after} filters, expected {target}")
    return PruneReport(sparsity, before, count_parameters(model), ch_before, ch_after)


def zeros_pct(model: nn.Module, modules: Sequence[nn.Module], example_inputs: torch.Tensor) -> float:
    """Share (%) of zeros in the ``weight`` of ``modules`` that the next forward pass uses: one forward pass on
    ``example_inputs`` first, so that ``torch.nn.utils.prune``'s pre-hooks recompute ``weight_orig * weight_mask``."""
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
    """One round of one arm for ``measure.interleaved``: ``build()`` a fresh model, a fresh optimizer, ``warmup``
    untimed training steps on the first batches, then every other batch timed -> ``(seconds per step, facts)``.
    ``zeros_of(model)``, when given, adds ``zeros_before`` and ``zeros_after`` (%) around the timed steps."""
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
