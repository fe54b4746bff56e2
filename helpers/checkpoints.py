"""Training checkpoints: atomic writes and safe loads (``weights_only=True``)."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import torch

from .files import atomic_write


class CheckpointError(RuntimeError):
    """A checkpoint file that cannot be read or does not fit the model."""



def save_checkpoint(path: Path | str, state: dict[str, Any]) -> Path:
    """Write ``state`` with torch.save to a temporary file, then rename it over ``path``.

    The rename is atomic, so a crash while writing leaves the previous checkpoint intact.
    """
    return atomic_write(path, lambda f: torch.save(state, f))


def load_checkpoint(path: Path | str) -> dict[str, Any]:
    """Load a checkpoint with ``weights_only=True``; a damaged file raises CheckpointError."""
    path = Path(path)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise
    except (RuntimeError, EOFError, OSError, pickle.UnpicklingError, ValueError) as exc:
        raise CheckpointError(
            f"Checkpoint {path} is damaged or not a checkpoint ({type(exc).__name__}). "
            "Delete it to start training from scratch, or pass another checkpoint path."
        ) from None
    if not isinstance(state, dict) or "model" not in state:
        raise CheckpointError(f"{path} is not a training checkpoint written by helpers.training (a dict with a 'model' state_dict).")
    return state
