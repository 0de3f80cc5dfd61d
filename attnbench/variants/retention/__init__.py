"""RetNet retention (Sun et al. 2023, "Retentive Network").

Three forms of one function, each a path: ``parallel`` (the dense reference, (Q K^T * D) V),
``chunkwise`` (the default: parallel inside chunks, recurrent across) and ``recurrent`` (one
position at a time), plus ``triton`` (fused, CUDA: the Triton chunkwise kernel, both
normalisations). Multi-scale decays gamma_h = 1 - 2^(-5 - h) per head; Q K^T is scaled by
1/sqrt(d) in every form, as both torchscale and fla do.

``normalize`` names where the implementations people use differ:

* ``none`` (default): the unnormalised formula, fla's naive retention.
* ``rownorm``: the RetNet paper's normalisation, as torchscale's parallel form: decay rows divided
  by the square root of their sum, scores by max(|row sum|, 1). torchscale's code divides by the
  sum of absolute values sum_m |R[n, m]| and detaches it; that sum has no recurrent or chunkwise
  form (torchscale's own recurrent and chunkwise forms compute something else and let GroupNorm
  absorb the difference). attnbench uses the paper's |sum_m R[n, m]|, which every form computes
  exactly (the row sum is retention applied to a column of ones), and lets gradients through it.

Retention is causal only (``bidirectional=False``): the decay gamma^(n - m) is defined for
n >= m, and the recurrent form is the point of RetNet. Bidirectional variants with gamma^|n - m|
(RMT, ViR) are other mechanisms, not covered here.

FLOPs (``Mechanism.flops``) are those of the default chunkwise path's matrix products, as
``torch.utils.flop_counter.FlopCounterMode`` counts them (the ones column of ``rownorm`` and the
padding of a last partial chunk included); decay multiplications and normalisers are not counted.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from attnbench.core import sources
from attnbench.core.capabilities import FLA_CORE
from attnbench.core.spec import Mechanism, Param, PathSpec, Shape, positive_int
from attnbench.kernels.triton_ops import REQUIRES, fused_path
from attnbench.libraries import fla_varlen
from attnbench.libraries.fla import FORMS
from attnbench.variants.retention import decode
from attnbench.variants.retention.chunkwise import chunkwise
from attnbench.variants.retention.decay import NORMALIZATIONS
from attnbench.variants.retention.fused import fla_form, triton
from attnbench.variants.retention.layer import MultiScaleRetention
from attnbench.variants.retention.parallel import parallel
from attnbench.variants.retention.recurrent import recurrent


def flops(shape: Shape, causal: bool, params: Mapping[str, Any]) -> int:
    """Matrix-product FLOPs of the chunkwise path: inside chunks Q K^T and (.) V; per chunk
    K^T V; across chunks Q R."""
    t, d = shape.seq_len, shape.head_dim
    dv = shape.dv + (1 if params["normalize"] == "rownorm" else 0)
    c = min(params["chunk"], t)
    tp = math.ceil(t / c) * c
    per_head = 2 * tp * c * (d + dv) + 2 * tp * d * dv * 2
    return shape.batch * shape.heads * per_head


MECHANISM = Mechanism(
    name="retention",
    family="retnet",
    description="RetNet retention (QK^T * D)V, multi-scale decays; parallel, chunkwise, recurrent",
    sources=(sources.SUN_2023,),
    params=(
        Param(
            "normalize",
            "none",
            "none: unnormalised (fla); rownorm: the paper's decay and score normalisation",
            choices=NORMALIZATIONS,
        ),
        positive_int("chunk", 64, "positions per chunk of the chunkwise path"),
    ),
    paths=(
        PathSpec("parallel", "reference", parallel, memory="O(n^2)", note="the parallel form"),
        PathSpec(
            "chunkwise",
            "efficient",
            chunkwise,
            memory="O(n chunk + n d^2 / chunk)",
            note="inner-chunk parallel, cross-chunk recurrent (loop over chunks)",
        ),
        PathSpec(
            "recurrent",
            "efficient",
            recurrent,
            memory="O(d^2) state; O(n d^2) kept for backward",
            note="Python loop over positions: the decoding form, slow",
        ),
        fused_path(
            triton,
            memory="O(n d + n d^2 / 64) (float32 chunk states, kept for the backward)",
            note="Triton chunkwise kernel; rownorm's score sums by the same kernel in fp32",
        ),
        *(
            PathSpec(
                f"fla-{form}",
                "fused",
                fla_form(form),
                memory="O(n d) (chunk: O(n d^2 / 64) states)" if form == "chunk" else "O(n d)",
                requires=(*REQUIRES, FLA_CORE),
                note=f"FLA's {form} retention kernel (fla-core); normalize=none only",
                varlen=fla_varlen.retention(form),
            )
            for form in FORMS
        ),
    ),
    bidirectional=False,
    flops=flops,
    decode=decode.DECODE,
    layer=MultiScaleRetention,
    time="O(n chunk d + n d^2)",
    memory="O(n chunk + n d^2 / chunk)",
    notes="Causal only: the decay gamma^(n-m) is defined for n >= m.",
)
