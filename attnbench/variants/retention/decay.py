"""RetNet's per-head decays and the pieces every efficient form shares.

Multi-scale decays (Sun et al. 2023): head h of H has gamma_h = 1 - 2^(-5 - h), so
head 0 forgets fastest (gamma = 0.96875) and each further head halves 1 - gamma. Computed in
float64 (``log1p``) and cast where used; note that in float16 gamma rounds to 1 from head 7 on
(1 - 2^-12 is not representable), in bfloat16 from head 4 on.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnbench.core.errors import AttnbenchError

NORMALIZATIONS = ("none", "rownorm")
CAUSAL_ONLY = (
    "retention is causal only: its decay gamma^(n-m) is defined for n >= m (RetNet is a "
    "recurrent model); use causal=True"
)


def require_causal(causal: bool) -> None:
    if not causal:
        raise AttnbenchError(CAUSAL_ONLY)


def log_gammas(heads: int, device: torch.device | str = "cpu") -> Tensor:
    """log(gamma_h) = log(1 - 2^(-5 - h)) for h = 0..heads-1, float64 [H]."""
    h = torch.arange(heads, dtype=torch.float64, device=device)
    return torch.log1p(-torch.exp2(-5.0 - h))


def with_ones(v: Tensor) -> Tensor:
    """V with a ones column appended, [B, H, T, Dv] -> [B, H, T, Dv + 1]: retention of the ones
    column is the row sum of the retention scores, which ``rownorm`` needs."""
    return torch.cat((v, torch.ones_like(v[..., :1])), dim=-1)


def finish(o: Tensor, normalize: str, log_g: Tensor) -> Tensor:
    """Apply the normalisation to the raw outputs of an efficient form.

    ``none``: ``o`` is the output. ``rownorm``: ``o`` is [B, H, T, Dv + 1] (V with a ones
    column); the decay row n is divided by r_n = sqrt(sum_{i<=n} gamma^i) = sqrt((1 - gamma^(n+1))
    / (1 - gamma)) (closed form), and the result by max(|row sum of the scores|, 1).
    """
    if normalize == "none":
        return o
    t = o.shape[-2]
    n = torch.arange(1, t + 1, dtype=torch.float64, device=o.device)
    row_sum = torch.expm1(n[None, :] * log_g[:, None]) / torch.expm1(log_g)[:, None]  # (H, T)
    r = row_sum.rsqrt().to(o.dtype)[None, :, :, None]  # (1, H, T, 1)
    num, den = o[..., :-1] * r, o[..., -1:] * r
    return num / den.abs().clamp(min=1.0)
