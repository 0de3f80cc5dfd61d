"""Trained weights small enough to commit beside a table: ``--keep-weights O`` writes, for every
finished checkpoint of the listed variants, ``OUT/weights/{variant}-seed{N}.pt``: the checkpoint's
key, step and history with the model's floating-point tensors in float16 and no optimiser or
generator state (about a sixth of the checkpoint's size).

Such a file is a finished checkpoint for ``--eval-only`` (``--checkpoints OUT/weights``): rows
evaluated on the trained weights, eval-time rows above all, can be added to a table later without
retraining. The float16 rounding of the weights (relative 2^-11) moves an accuracy by a few masked
tokens at most; the results README that commits such files says by how much it measured. It cannot
be resumed: the optimiser state is gone.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from attnbench.core.errors import AttnbenchError
from attnbench.extrapolation.training.checkpoints import atomic_save, load_checkpoint

FOLDER = "weights"


def half(ckpt: dict[str, Any]) -> dict[str, Any]:
    """A finished checkpoint as a weights-only one, float tensors in float16."""
    if not ckpt.get("done"):
        raise AttnbenchError(
            f"an unfinished checkpoint (step {ckpt.get('step')}) has no weights to keep"
        )
    model = {
        name: t.to(torch.float16) if t.is_floating_point() else t
        for name, t in ckpt["model"].items()
    }
    kept = {k: v for k, v in ckpt.items() if k not in ("optim", "rng", "model")}
    return kept | {"model": model, "optim": None, "rng": None, "weights_only": True}


def keep(paths: Iterable[Path], out_dir: Path) -> list[Path]:
    """Write the weights-only copy of every checkpoint in ``paths`` into ``out_dir``."""
    written = []
    for path in paths:
        target = out_dir / path.name
        atomic_save(half(load_checkpoint(path)), target)
        written.append(target)
    return written
