"""Checkpoints: what one holds, written whole or not at all, read back, and the key that says
which training made it.

A checkpoint holds the model, the optimiser, the step, the training time so far, and every random
state that the rest of training depends on (the batches' generators, torch's and Python's global
generators), so ``--resume`` ends with the same numbers as an uninterrupted run
(:mod:`attnbench.extrapolation.training.loop` writes them). Its ``key`` is everything that changes
the trained weights (:func:`attnbench.extrapolation.experiment.plan.checkpoint_key`); a checkpoint
resumes only under the same key (:func:`check_key`). The files hold tensors and plain data only
(``torch.load(weights_only=True)``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from attnbench.core.errors import AttnbenchError
from attnbench.runtime.outputs import atomic_open, write_failed
from attnbench.runtime.schema import key_difference
from attnbench.runtime.torch_files import why_unreadable

CHECKPOINT_FORMAT = 1


def key_hash(key: Mapping[str, Any]) -> str:
    """A short stable hash of a checkpoint key (plain JSON data)."""
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def atomic_save(obj: Any, path: Path) -> None:
    """Save whole or not at all: a temporary file, renamed when complete, removed on failure (a
    full disk leaves the previous checkpoint and no temporary file, and says so in one line
    naming the checkpoint: :class:`~attnbench.runtime.outputs.WriteFailed`). torch.save is
    given the open file, not its name: writing to a name, a full disk is a RuntimeError from
    its zip writer (``enforce fail at inline_container.cc``) that names neither file nor cause;
    writing to a file, the OSError of the write comes first, and the RuntimeError of closing
    the archive follows it (it is found there)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    existed = path.exists()
    try:
        with atomic_open(path, "wb", what="checkpoint") as f:
            torch.save(obj, f)
    except RuntimeError as e:
        cause = _os_error_behind(e)
        if cause is None and "inline_container" not in str(e):
            raise
        failed = cause or OSError(None, "the write failed (a full disk?)")
        raise write_failed(path, failed, "checkpoint", existed) from None


def _os_error_behind(e: BaseException | None) -> OSError | None:
    """The OSError a RuntimeError was raised while handling, if any (torch's zip writer)."""
    while e is not None and not isinstance(e, OSError):
        e = e.__context__
    return e


def load_checkpoint(path: Path) -> dict[str, Any]:
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # a torn or foreign file: say which, in one line
        raise AttnbenchError(f"cannot read checkpoint {path}: {why_unreadable(path, e)}") from None
    if not isinstance(ckpt, dict) or "format" not in ckpt:
        held = "a dict without a format" if isinstance(ckpt, dict) else f"a {type(ckpt).__name__}"
        raise AttnbenchError(
            f"{path} is not an attnbench extrapolation checkpoint (a torch file holding {held})"
        )
    if ckpt["format"] != CHECKPOINT_FORMAT:
        raise AttnbenchError(
            f"checkpoint {path} was written by another version of attnbench (format "
            f"{ckpt['format']!r}; this one reads {CHECKPOINT_FORMAT}): train it again (--overwrite)"
        )
    return ckpt


def check_key(ckpt: Mapping[str, Any], key: Mapping[str, Any], path: Path) -> None:
    if ckpt.get("key_hash") != key_hash(key):
        diff = key_difference(ckpt.get("key", {}), key) or "unknown fields"
        raise AttnbenchError(
            f"checkpoint {path} was trained with another config ({diff}); use the same options, "
            "another --out, or --overwrite"
        )
