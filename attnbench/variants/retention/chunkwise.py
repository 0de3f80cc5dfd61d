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
import torch.nn.functional as F
from torch import Tensor

from attnbench.core.precision import float32_sums
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
    pad = n * c - t
    qc = F.pad(q / math.sqrt(d), (0, 0, 0, pad)).view(b, h, n, c, d)  # (B, H, n, c, D)
    kc = F.pad(k, (0, 0, 0, pad)).view(b, h, n, c, d)  # (B, H, n, c, D)
    vc = F.pad(vv, (0, 0, 0, pad)).view(b, h, n, c, dv)  # (B, H, n, c, Dv')

    pos = torch.arange(c, dtype=torch.float64, device=q.device)
    gap = pos[:, None] - pos[None, :]  # (c, c)
    lg = log_g[:, None, None]  # (H, 1, 1)
    local = torch.where(gap >= 0, torch.exp(gap.clamp(min=0) * lg), 0.0)  # (H, c, c)
    xi = torch.exp((pos + 1) * lg[:, 0])  # (H, c): from the previous chunk's end to query a
    zeta = torch.exp((c - 1 - pos) * lg[:, 0])  # (H, c): from key j to this chunk's end
    carry = torch.exp(c * log_g).to(q.dtype)[:, None, None]  # (H, 1, 1): gamma^B
    local, xi, zeta = (x.to(q.dtype)[:, None] for x in (local, xi, zeta))  # (H, 1, ...)

    inner = ((qc @ kc.transpose(-2, -1)) * local) @ vc  # (B, H, n, c, Dv')
    states = kc.transpose(-2, -1) @ (vc * zeta[..., None])  # (B, H, n, D, Dv')
    r = states.new_zeros(b, h, d, dv)  # R_{-1} = 0
    before = []
    for state in states.unbind(2):  # unbind, not states[:, :, i]: one backward, not n zero-fills
        before.append(r)  # R_{i-1}
        r = carry * r + state
    cross = (qc * xi[..., None]) @ torch.stack(before, dim=2)  # (B, H, n, c, Dv')
    out = (inner + cross).view(b, h, n * c, dv)[:, :, :t]
    return finish(out, normalize, log_g)
