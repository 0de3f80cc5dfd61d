"""Where the sparse engine's parts run: on the CPU, PyTorch's fused flash-attention kernel
(:mod:`attnbench.variants.sparse.cpu_fused`); elsewhere, the chunked executor of
:mod:`attnbench.variants.sparse.engine`. Every pattern's efficient path calls :func:`attend`."""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from torch import Tensor

from attnbench.variants.sparse import cpu_fused
from attnbench.variants.sparse.engine import Part, Rule, attend_chunked


def attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    parts: Sequence[Part],
    rule: Rule,
    key: Hashable | None = None,
) -> Tensor:
    """Softmax attention restricted to ``rule`` over the union of ``parts``.

    q, k ``[B, H, n, D]``, v ``[B, H, n, Dv]`` -> ``[B, H, n, Dv]``; scale 1/sqrt(D). ``key``:
    what identifies the pattern at this length besides n (its name, causal and parameters), so
    that the fused executor builds its masks once and reuses them; None builds them every call.
    """
    if not parts:
        raise ValueError("attend needs at least one part")
    if cpu_fused.supports(q, k, v):
        return cpu_fused.attend(q, k, v, parts, rule, key)
    return attend_chunked(q, k, v, parts, rule)
