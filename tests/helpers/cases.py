"""Cases built from the registry: registering a mechanism is enough to get it tested."""

from __future__ import annotations

import pytest
import torch

from attnbench import registry
from attnbench.core import capabilities
from attnbench.core.spec import Mechanism, PathSpec, Shape

#: Why FlexAttention's forward cannot run on this CPU (None where it can: Inductor needs a C++
#: compiler, and its FlexAttention template a vector instruction set torch is using).
CPU_FLEX = capabilities.flex("cpu", backward=False)
needs_cpu_flex = pytest.mark.skipif(CPU_FLEX is not None, reason=f"CPU FlexAttention: {CPU_FLEX}")
#: Why torch.compile cannot build C++ kernels on this CPU (None where it can: the same needs).
CPU_INDUCTOR = capabilities.inductor("cpu", backward=False)
needs_cpu_inductor = pytest.mark.skipif(CPU_INDUCTOR is not None, reason=f"{CPU_INDUCTOR}")

LENGTHS = (1, 7, 97, 257)
HEAD_DIMS = (32, 64, 80)
BATCH, HEADS = 2, 4


def directions(mech: Mechanism) -> list[bool]:
    """The ``causal`` flags ``mech`` supports: False when bidirectional, True when causal."""
    return [c for c, ok in ((False, mech.bidirectional), (True, mech.causal)) if ok]


def runnable_paths(mech: Mechanism, kinds=("efficient", "fused")) -> list[PathSpec]:
    """``mech``'s paths of these kinds that run on this CPU (with a backward when it has one)."""
    return [p for p in mech.paths if p.kind in kinds and not p.unavailable("cpu", mech.backward)]


def path_cases() -> list:
    """(mechanism, path, causal, shape, dtype) for every faster path that runs on this CPU."""
    cases = []
    for mech in registry.MECHANISMS:
        params = mech.defaults
        for path in runnable_paths(mech):
            for causal in directions(mech):
                grid = [(t, 32, torch.float32) for t in LENGTHS]
                grid += [(97, d, torch.float32) for d in HEAD_DIMS[1:]]
                grid += [(t, 32, torch.float64) for t in (7, 97)]
                for t, d, dtype in grid:
                    shape = mech.shape_for(Shape(BATCH, HEADS, t, d), params)
                    tag = "causal" if causal else "bidir"
                    dname = str(dtype).removeprefix("torch.")
                    cases.append(
                        pytest.param(
                            mech,
                            path,
                            causal,
                            shape,
                            dtype,
                            id=f"{mech.name}:{path.name}-{tag}-{shape.tag()}-{dname}",
                        )
                    )
    return cases


def mechanism_params(kinds=("reference", "efficient", "fused")) -> list:
    """(mechanism, path) for every path of every mechanism that runs on this CPU."""
    return [
        pytest.param(m, p, id=f"{m.name}:{p.name}")
        for m in registry.MECHANISMS
        for p in m.paths
        if p.kind in kinds and not p.unavailable("cpu", m.backward)
    ]
