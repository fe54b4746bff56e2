"""Training checkpoints in the course's one format (``training_state``, ``save_checkpoint``, ``restore``)."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import torch

from .files import atomic_write

FORMAT = 2
PROGRESS_KEYS = ("epoch", "batch", "step", "loss_sum", "epoch_times", "epoch_losses", "data_wait")


class CheckpointError(RuntimeError):
    """A checkpoint file that cannot be read or does not fit the model."""


def save_checkpoint(path: Path | str, state: dict[str, Any]) -> Path:
    """Write ``state`` with torch.save to a temporary file, then rename it over ``path`` (atomic)."""
    return atomic_write(path, lambda f: torch.save(state, f))


def load_checkpoint(path: Path | str) -> dict[str, Any]:
    """Load a checkpoint with ``weights_only=True``; a damaged file raises CheckpointError."""
    path = Path(path)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise
    except (RuntimeError, EOFError, OSError, pickle.UnpicklingError, ValueError) as exc:
        raise CheckpointError(f"Checkpoint {path} is damaged or not a checkpoint ({type(exc).__name__}). "
                              "Delete it to start training from scratch, or pass another checkpoint path.") from None
    if not isinstance(state, dict) or "model" not in state:
        raise CheckpointError(f"{path} is not a training checkpoint written by helpers.training (a dict with a 'model' state_dict).")
    return state


def fresh_progress() -> dict[str, Any]:
    """Where a new run starts: epoch 0, batch 0, and empty statistics."""
    return {"epoch": 0, "batch": 0, "step": 0, "loss_sum": 0.0, "epoch_times": [], "epoch_losses": [],
            "data_wait": [], "resumed_from": None}


def rng_state(device: torch.device | str = "cpu") -> dict[str, Any]:
    """CPU and accelerator random-number state, to resume the same random stream."""
    device = torch.device(device)
    state: dict[str, Any] = {"cpu": torch.get_rng_state(), "device_type": device.type, "device": None}
    if device.type in ("cuda", "xpu"):
        state["device"] = getattr(torch, device.type).get_rng_state(device)
    return state


def set_rng_state(state: dict[str, Any], device: torch.device | str = "cpu") -> None:
    """Restore ``rng_state``; the accelerator part only on the same kind of device."""
    device = torch.device(device)
    torch.set_rng_state(state["cpu"])
    if state.get("device") is not None and state.get("device_type") == device.type:
        getattr(torch, device.type).set_rng_state(state["device"], device)


def plain_module(model: torch.nn.Module) -> torch.nn.Module:
    """The module under a DDP wrapper (``.module``) and/or torch.compile (``._orig_mod``)."""
    while True:
        inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
        if not isinstance(inner, torch.nn.Module):
            return model
        model = inner


def training_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, progress: dict[str, Any], *,
                   scaler: Any = None, device: torch.device | str = "cpu") -> dict[str, Any]:
    """The course's checkpoint dict for ``progress`` (``fresh_progress`` keys)."""
    return {"format": FORMAT, "model": plain_module(model).state_dict(), "optimizer": optimizer.state_dict(),
            "scaler": scaler.state_dict() if scaler is not None else None, "rng": rng_state(device),
            **{k: progress[k] for k in PROGRESS_KEYS}}


def restore(path: Path | str, model: torch.nn.Module, optimizer: torch.optim.Optimizer, *, scaler: Any = None,
            device: torch.device | str = "cpu") -> dict[str, Any]:
    """Load a checkpoint into the plain model, optimizer, scaler and random streams; return its progress."""
    state = load_checkpoint(path)
    try:
        plain_module(model).load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        progress = {k: state[k] for k in (*PROGRESS_KEYS, "rng")}
    except (RuntimeError, ValueError, KeyError) as exc:
        raise CheckpointError(f"Checkpoint {path} does not fit this model/optimizer or this course version "
                              f"({type(exc).__name__}). Delete it or use a different checkpoint path.") from None
    if scaler is not None and state.get("scaler"):
        scaler.load_state_dict(state["scaler"])
    set_rng_state(progress.pop("rng"), device)
    return {**progress, "resumed_from": [progress["epoch"], progress["batch"]]}
