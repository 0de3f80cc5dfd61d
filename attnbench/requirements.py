"""What a path can need from the machine (the checks themselves: :mod:`attnbench.capabilities`).
Each check returns None when met, else the reason."""

from __future__ import annotations

from attnbench import capabilities
from attnbench.spec import Requirement


def _requirement(name: str) -> Requirement:
    check = capabilities.CHECKS[name]
    return Requirement(name, lambda device, backward: check(device.type, backward))


CUDA = _requirement("cuda")
TRITON = _requirement("triton")
FLEX = _requirement("flex")

#: Library-backed paths: the other project's package, at a tested version.
LOCAL_ATTENTION = _requirement("package:local-attention")
FLA_CORE = _requirement("package:fla-core")
SAGEATTENTION = _requirement("package:sageattention")
XFORMERS = _requirement("package:xformers")
