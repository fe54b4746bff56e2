"""Structured pruning: NNI computes which filters to drop, Torch-Pruning removes them.

NNI 3.0 (archived) still computes L1-norm masks on current PyTorch, but its own
``ModelSpeedup`` -- the step that physically shrinks the model -- fails on torch >= 2.2.
So the course splits the job: NNI's masks say which output channels of each Conv2d are
zero; Torch-Pruning's dependency graph removes exactly those channels and everything
coupled to them (the next layer's input channels, the flattened Linear inputs).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Sequence

import torch
from torch import nn

from .models import count_parameters


class PruningError(ValueError):
    """Bad pruning input (sparsity out of range, no prunable layer)."""


def check_sparsity(sparsity: float) -> float:
    """Return ``sparsity`` if it is a fraction strictly between 0 and 1, else raise PruningError."""
    if not isinstance(sparsity, (int, float)) or not 0.0 < float(sparsity) < 1.0:
        raise PruningError(
            f"sparsity must be a fraction between 0 and 1 (exclusive), e.g. 0.5 for 50%; got {sparsity!r}"
        )
    return float(sparsity)


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
            f"NNI is not importable ({exc}). Install the course environment (`make setup`) or `pip install nni==3.0`."
        ) from None
    if not any(type(m).__name__ in op_types for m in model.modules()):
        raise PruningError(f"the model has no layer of type {', '.join(op_types)} to prune")
    pruner = L1NormPruner(model, [{"op_types": list(op_types), "sparse_ratio": sparsity}])
    _, masks = pruner.compress()
    pruner.unwrap_model()
    return {name: {k: v.detach().clone() for k, v in m.items()} for name, m in masks.items()}


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

    @property
    def reduction(self) -> float:
        return 1.0 - self.params_after / self.params_before


def prune(model: nn.Module, sparsity: float, example_inputs: torch.Tensor,
          op_types: Sequence[str] = ("Conv2d",)) -> PruneReport:
    """NNI L1-norm masks at ``sparsity`` for every ``op_types`` layer, then physical removal."""
    before = count_parameters(model)
    masks = nni_l1_masks(model, sparsity, op_types)
    modules = dict(model.named_modules())
    ch_before = {n: modules[n].weight.shape[0] for n in masks}
    remove_channels(model, zeroed_channels(masks), example_inputs)
    modules = dict(model.named_modules())
    ch_after = {n: modules[n].weight.shape[0] for n in masks}
    return PruneReport(sparsity, before, count_parameters(model), ch_before, ch_after)


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
