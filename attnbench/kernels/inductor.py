"""Paths compiled by ``torch.compile`` (Inductor): a plain PyTorch function whose elementwise
passes Inductor fuses into one loop each, around the library matrix products it calls as they are.

On the CPU this is what the eager efficient paths cannot do: bidirectional linear attention at
D = 32 spends about as long in its feature map (an exponential, clamps and an add: five passes
over n x d values) and normaliser as in its two products; compiled, each is one pass (Inductor's
C++ loops, vectorised). On CUDA Inductor writes Triton kernels instead.

Shapes are static (``dynamic=False``): each new length compiles once (about 3-5 s on one CPU
thread). With symbolic shapes the CPU code ran slower than eager (causal linear attention at
n = 8192: 22.9 ms against eager's 15.7; static: 13.2). A call signature beyond dynamo's recompile
limit must not quietly run eagerly (timed as if compiled): :func:`raise_dynamo_limits` raises the
limits and makes a hit an error, and :func:`run_compiled` starts dynamo afresh before a function
meets more signatures than the limit allows.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

import torch
from torch import Tensor

from attnbench.core.capabilities import INDUCTOR

#: Recompilations one compiled function may have (one per length, direction, dtype...).
RECOMPILE_LIMIT = 64
#: dynamo's limit over all compiled functions together (torch's default is 256).
ACCUMULATED_RECOMPILE_LIMIT = 4096

REQUIRES = (INDUCTOR,)

_compiled: dict[Callable[..., Tensor], Callable[..., Tensor]] = {}
#: The call signatures each compiled function has met since dynamo last started afresh.
_signatures: dict[Callable[..., Tensor], set[Hashable]] = {}


def raise_dynamo_limits() -> None:
    """Raise dynamo's recompile limits (never lower them), and make a limit hit an error rather
    than a silent eager run of the function in the middle of a sweep."""
    import torch._dynamo.config as dynamo_config

    dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, RECOMPILE_LIMIT)
    if hasattr(dynamo_config, "accumulated_recompile_limit"):
        dynamo_config.accumulated_recompile_limit = max(
            dynamo_config.accumulated_recompile_limit, ACCUMULATED_RECOMPILE_LIMIT
        )
    if hasattr(dynamo_config, "fail_on_recompile_limit_hit"):
        dynamo_config.fail_on_recompile_limit_hit = True


def call_signature(*args: Any) -> tuple:
    """What dynamo specialises a compiled call on: each tensor's shape, strides, dtype, device and
    requires_grad, the grad mode, and every other argument as it is."""
    return (
        tuple(
            (tuple(a.shape), a.stride(), a.dtype, str(a.device), a.requires_grad)
            if isinstance(a, Tensor)
            else a
            for a in args
        ),
        torch.is_grad_enabled(),
    )


def reset_dynamo() -> None:
    """Start dynamo's caches afresh (every compiled function recompiles on its next call;
    Inductor's on-disk cache makes that quick for a signature compiled before)."""
    from torch import _dynamo

    _dynamo.reset()
    _compiled.clear()
    _signatures.clear()


def run_compiled(fn: Callable[..., Tensor], *args: Any) -> Tensor:
    """``fn(*args)`` under ``torch.compile(fn, dynamic=False)``, compiled on first use. A new
    signature past half of RECOMPILE_LIMIT first starts dynamo afresh; a failed call does too (a
    failure can leave dynamo refusing every later call of the process), then raises."""
    signature = call_signature(*args)
    seen = _signatures.setdefault(fn, set())
    if signature not in seen and len(seen) >= RECOMPILE_LIMIT // 2:
        reset_dynamo()
        seen = _signatures.setdefault(fn, set())
    seen.add(signature)
    if fn not in _compiled:
        raise_dynamo_limits()
        _compiled[fn] = torch.compile(fn, dynamic=False)
    try:
        return _compiled[fn](*args)
    except Exception:
        reset_dynamo()
        raise
