"""What a path can need from the machine. Each check returns None when met, else the reason."""

from __future__ import annotations

import importlib.util

import torch

from attnbench.spec import Requirement


def _cuda(device: torch.device, backward: bool) -> str | None:
    if not torch.cuda.is_available():
        return "needs CUDA (no GPU visible to torch)"
    if device.type != "cuda":
        return f"needs a CUDA device (asked for {device.type})"
    return None


def _triton(device: torch.device, backward: bool) -> str | None:
    if importlib.util.find_spec("triton") is None:
        return "needs Triton (pip install triton)"
    return None


def _flex(device: torch.device, backward: bool) -> str | None:
    if importlib.util.find_spec("torch.nn.attention.flex_attention") is None:
        return f"needs FlexAttention (torch >= 2.5; this is {torch.__version__})"
    if backward and device.type != "cuda":
        return "FlexAttention has no backward on CPU (forward only)"
    return None


CUDA = Requirement("cuda", _cuda)
TRITON = Requirement("triton", _triton)
FLEX = Requirement("flex", _flex)
