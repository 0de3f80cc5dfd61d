"""RetNet's chunkwise form (Sun et al. 2023): parallel inside chunks of B positions, recurrent
across.

For chunk i (positions iB .. iB + B - 1, local index a for queries and j for keys)::

    R_i = K_[i]^T (V_[i] * zeta) + gamma^B R_{i-1},        zeta_j = gamma^(B - 1 - j)
    O_[i] = (Q_[i] K_[i]^T / sqrt(d) * D_local) V_[i]  +  (Q_[i] / sqrt(d) * xi) R_{i-1},
                                                           xi_a = gamma^(a + 1)

Without the paper's zeta (each key decayed to the chunk's end) the recurrence would read
R_i = K_[i]^T V_[i] + gamma^B R_{i-1}; zeta is needed for the three forms to agree, and is used
here. A last partial chunk is zero-padded (zero keys add nothing; padded queries are cut off).
The recurrence over chunks is a Python loop of T / B steps; memory O(T B + T d^2 / B).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from attnbench.core.precision import float32_sums
from attnbench.variants.chunks import chunked
from attnbench.variants.retention.decay import finish, log_gammas, require_causal, with_ones


@float32_sums(name="retention:chunkwise")
def chunkwise(
    q: Tensor, k: Tensor, v: Tensor, *, causal: bool, normalize: str, chunk: int
) -> Tensor:
    """Inner-chunk parallel plus cross-chunk recurrent. q, k, v: [B, H, T, D] -> [B, H, T, Dv]."""
    require_causal(causal)
    b, h, t, d = q.shape
    log_g = log_gammas(h, q.device)  # (H,) float64
    vv = with_ones(v) if normalize == "rownorm" else v
    dv = vv.shape[-1]
    c = min(chunk, t)
    n = math.ceil(t / c)
    qc, kc, vc = (chunked(x, n, c).view(b, h, n, c, -1) for x in (q, k, vv))  # (B, H, n, c, .)

    pos = torch.arange(c, dtype=torch.float64, device=q.device)
    gap = pos[:, None] - pos[None, :]  # (c, c)
    lg = log_g[:, None, None]  # (H, 1, 1)
    scale = 1 / math.sqrt(d)  # Q K^T / sqrt(d): folded into the query-side decays
    local = torch.where(gap >= 0, torch.exp(gap.clamp(min=0) * lg), 0.0) * scale  # (H, c, c)
    xi = torch.exp((pos + 1) * lg[:, 0]) * scale  # (H, c): previous chunk's end to query a
    zeta = torch.exp((c - 1 - pos) * lg[:, 0])  # (H, c): from key j to this chunk's end
    carry = torch.exp(c * log_g).to(q.dtype)[:, None, None]  # (H, 1, 1): gamma^B
    local, xi, zeta = (x.to(q.dtype)[:, None] for x in (local, xi, zeta))  # (H, 1, ...)

    inner = torch.matmul(qc, kc.transpose(-2, -1)).mul_(local) @ vc  # (B, H, n, c, Dv')
    states = kc.transpose(-2, -1) @ (vc * zeta[..., None])  # (B, H, n, D, Dv')
    r = states.new_zeros(b, h, d, dv)  # R_{-1} = 0
    before = []
    for state in states.unbind(2):  # unbind, not states[:, :, i]: one backward, not n zero-fills
        before.append(r)  # R_{i-1}
        r = torch.addcmul(state, carry, r)  # R_i = S_i + gamma^B R_{i-1}
    across = torch.stack(before, dim=2).view(b * h * n, d, dv)  # R_{i-1} for each chunk i
    # inside + across in one product: Q_[i] xi R_{i-1} added to the inner part's result
    out = torch.baddbmm(inner.view(b * h * n, c, dv), (qc * xi[..., None]).view(-1, c, d), across)
    return finish(out.view(b, h, n * c, dv)[:, :, :t], normalize, log_g)
