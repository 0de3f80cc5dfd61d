"""The record every sparse mechanism shares, built by :func:`sparse_mechanism` from what differs.

Each sparse pattern (Su 2019; Child et al. 2019; Zaheer et al. 2020; Ding et al. 2023) is the
family ``sparse`` with the same three paths, in this order: ``reference`` (dense scores, the
pattern as -inf), ``efficient`` (the engine, :mod:`attnbench.variants.sparse.engine`) and
``flex`` (FlexAttention on the literal rule ``visible``), plus the rule and its exact pair count.
A mechanism with more paths (``local``'s library paths) appends them after these three.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from torch import Tensor

from attnbench.core.decode import DecodePath
from attnbench.core.sources import Source
from attnbench.core.spec import Mechanism, Param, PathSpec, Shape
from attnbench.kernels.flex import ScoreModBuilder, flex_fused
from attnbench.variants.sparse.common import Visible

#: A path function ``fn(q, k, v, *, causal, <the parameters it reads>) -> o``, [B, H, T, D].
PathFn = Callable[..., Tensor]


def sparse_mechanism(
    *,
    name: str,
    description: str,
    sources: tuple[Source, ...],
    params: tuple[Param, ...],
    visible: Visible,
    pair_count: Callable[[int, bool, Mapping[str, Any]], int],
    reference: PathFn,
    efficient: PathFn,
    efficient_memory: str,
    efficient_note: str,
    flex_note: str,
    time: str,
    memory: str,
    reference_memory: str = "O(n^2)",  # LongNet's reference repeats the keys per branch
    score_mod: ScoreModBuilder | None = None,  # flex's score modification (LongNet's log m)
    check_params: Callable[[Mapping[str, Any]], str | None] | None = None,
    flops: Callable[[Shape, bool, Mapping[str, Any]], int] | None = None,
    more_paths: tuple[PathSpec, ...] = (),
    decode: tuple[DecodePath, ...] = (),
    no_decode: str = "",
) -> Mechanism:
    """A sparse mechanism's :class:`Mechanism`: reference, efficient and flex paths, then
    ``more_paths``; ``visible`` and ``pair_count`` as given; its decode forms
    (:mod:`attnbench.variants.sparse.decode`), or why it has none."""
    return Mechanism(
        name=name,
        family="sparse",
        description=description,
        sources=sources,
        params=params,
        check_params=check_params,
        paths=(
            PathSpec("reference", "reference", reference, memory=reference_memory),
            PathSpec(
                "efficient", "efficient", efficient, memory=efficient_memory, note=efficient_note
            ),
            flex_fused(visible, score_mod, note=flex_note),
            *more_paths,
        ),
        visible=visible,
        pair_count=pair_count,
        flops=flops,
        time=time,
        memory=memory,
        decode=decode,
        no_decode=no_decode,
    )
