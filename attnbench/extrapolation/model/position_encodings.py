"""The trained position encodings of the extrapolation model besides rotary (``model.position``):
ALiBi's linear biases, T5's bucketed relative bias and xPos; NoPE is no encoding at all (the
causal mask alone tells a query where it is). Each is written here as its source defines it; the
mixer that applies them is :mod:`.position_mixer`.

- ALiBi: Press, Smith, Lewis, "Train Short, Test Long: Attention with Linear Biases Enables Input
  Length Extrapolation", ICLR 2022, https://arxiv.org/abs/2108.12409. The score of query i and key
  j gets -m_h (i - j), m_h a fixed slope per head (:func:`alibi_slopes`). The paper's models are
  causal; in the bidirectional encoder (the MLM) the same bias is applied on both sides, -m_h
  abs(i - j): "adapted for a bidirectional encoder", not the paper's form.
- T5: Raffel, Shazeer, Roberts, Lee, Narang, Matena, Zhou, Li, Liu, "Exploring the Limits of
  Transfer Learning with a Unified Text-to-Text Transformer", JMLR 2020,
  https://arxiv.org/abs/1910.10683: "each 'embedding' is simply a scalar that is added to the
  corresponding logit", one per bucket of the relative position and per head, shared across
  layers. The bucket rule (:func:`t5_bucket`) is that of the paper's code (mesh-tensorflow's
  ``_relative_position_bucket``, as Hugging Face Transformers' T5 also computes it).
- xPos: Sun, Dong, Patra, Ma, Huang, Benhaim, Chaudhary, Song, Wei, "A Length-Extrapolatable
  Transformer", ACL 2023, https://arxiv.org/abs/2212.10554: rotary rotation with each pair's
  query scaled by zeta_i^(n / B) and key by zeta_i^(-m / B), B = 512 (their code's
  ``scale_base``), so the score of query n and key m decays as zeta_i^((n - m) / B)
  (:func:`xpos_rotate`); causal only (for n < m the factor would grow without bound).
- NoPE: Kazemnejad, Padhi, Natesan Ramamurthy, Das, Reddy, "The Impact of Positional Encoding on
  Length Generalization in Transformers", NeurIPS 2023, https://arxiv.org/abs/2305.19466: a
  decoder-only Transformer with no position encoding; causal only, since a bidirectional encoder
  without positions cannot tell one order of its input from another.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from attnbench.core.errors import AttnbenchError
from attnbench.extrapolation.model.positions import rotate

#: ``model.position``: the encodings there are, each with one line.
POSITIONS: dict[str, str] = {
    "rope": "rotary position embedding in every attention layer (Su et al., RoFormer)",
    "alibi": "ALiBi (Press et al. 2022): scores - m_h |i - j|, fixed geometric slopes per head",
    "t5": "T5's relative bias (Raffel et al. 2020): a learned scalar per bucket of i - j and head",
    "nope": "no position encoding (Kazemnejad et al. 2023): causal objective only",
    "xpos": "xPos (Sun et al. 2023): rotary with a per-pair decay zeta^((i - j)/512); causal only",
}


def row_note(position: str, causal: bool) -> str:
    """What a trained row's ``note`` says of its encoding: that ALiBi in the bidirectional
    encoder is not the paper's form ("" for every other case)."""
    if position == "alibi" and not causal:
        return "ALiBi adapted for a bidirectional encoder: -m_h |i - j| on both sides"
    return ""


#: Encodings that exist only with a causal mask (see the module docstring).
CAUSAL_ONLY = ("nope", "xpos")
#: Encodings added to the scores of softmax attention: they need the mechanism's scores.
ON_SCORES = ("alibi", "t5", "xpos")

#: xPos's constants (Sun et al. 2023; their code's ``scale_base`` and the 0.4 of its ``scale``).
XPOS_GAMMA, XPOS_SCALE_BASE = 0.4, 512.0
#: T5's bucket count (the paper's 32).
T5_BUCKETS = 32


def alibi_slopes(heads: int) -> list[float]:
    """The head slopes of Press et al. 2022's reference code: for H a power of two the geometric
    sequence starting at 2^(-8/H) with that ratio (2^(-8/H), 2^(-16/H), ..., 2^(-8)); otherwise
    the slopes of the power of two below H, then every other slope of twice that power."""
    if heads < 1:
        raise AttnbenchError(f"ALiBi needs at least one head; got {heads}")

    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    if heads & (heads - 1) == 0:
        return power_of_two(heads)
    below = 2 ** math.floor(math.log2(heads))
    return power_of_two(below) + alibi_slopes(2 * below)[0::2][: heads - below]


def alibi_bias(slopes: Tensor, n: int) -> Tensor:
    """-m_h abs(i - j) for queries i and keys j of a window of n: [H, n, n] in ``slopes``' dtype.
    Under a causal mask only j <= i is read, where it is the paper's -m_h (i - j)."""
    pos = torch.arange(n, device=slopes.device)
    distance = (pos[:, None] - pos[None, :]).abs().float()  # (n, n), exact up to 2^24
    # in float32, then one rounding to the slopes' dtype (a bfloat16 distance 257 would be 256)
    return (-slopes.float()[:, None, None] * distance).to(slopes.dtype)  # (H, n, n)


def t5_bucket(relative: Tensor, bidirectional: bool, buckets: int, max_distance: int) -> Tensor:
    """T5's bucket of each relative position ``relative`` = j - i (key minus query), long.

    Bidirectional: half the buckets for keys after the query, half for the rest. Of a side's
    buckets, the first half are exact distances 0, 1, ...; the other half cover distances up to
    ``max_distance`` in logarithmically growing bins, and every farther distance shares the last
    bucket. Causal: every bucket for keys at or before the query."""
    out = torch.zeros_like(relative)
    if bidirectional:
        buckets //= 2
        out = out + (relative > 0).long() * buckets
        distance = relative.abs()
    else:
        distance = (-relative).clamp(min=0)
    exact = buckets // 2
    scaled = distance.clamp(min=1).double() / exact
    large = exact + (scaled.log() / math.log(max_distance / exact) * (buckets - exact)).long()
    large = large.clamp(max=buckets - 1)
    return out + torch.where(distance < exact, distance, large)


def check_t5(buckets: int, max_distance: int, bidirectional: bool) -> None:
    """Refuse a bucket rule T5's formula cannot compute: the log bins need max_distance beyond the
    exact distances (buckets / 2 of them causal, buckets / 4 on each side bidirectional)."""
    exact = buckets // 4 if bidirectional else buckets // 2
    if buckets < 4 or max_distance <= exact:
        where = "on each side of a bidirectional encoder" if bidirectional else "causal"
        raise AttnbenchError(
            f"model.t5_buckets = {buckets} with model.t5_max_distance = {max_distance} is not "
            f"accepted: T5's logarithmic buckets need max_distance > {exact}, the exact "
            f"distances ({where}), and buckets >= 4; 0 means model.train_len"
        )


class T5Bias(nn.Module):
    """T5's relative bias: a learned scalar per (bucket of j - i, head), the same module in every
    layer (T5 shares it across layers). ``forward(n)`` -> [H, n, n]."""

    def __init__(self, heads: int, buckets: int, max_distance: int, bidirectional: bool) -> None:
        super().__init__()
        check_t5(buckets, max_distance, bidirectional)
        self.buckets, self.max_distance = buckets, max_distance
        self.bidirectional = bidirectional
        self.table = nn.Embedding(buckets, heads)

    def bucket_index(self, n: int, device: torch.device) -> Tensor:
        pos = torch.arange(n, device=device)
        relative = pos[None, :] - pos[:, None]  # (n, n): j - i
        return t5_bucket(relative, self.bidirectional, self.buckets, self.max_distance)

    def forward(self, n: int) -> Tensor:
        index = self.bucket_index(n, self.table.weight.device)  # (n, n)
        return self.table(index).permute(2, 0, 1)  # (H, n, n)


def xpos_zeta(head_dim: int) -> Tensor:
    """xPos's per-pair base zeta_i = (i / (D/2) + gamma) / (1 + gamma), i = 0..D/2-1, float64
    (pair i has the rotary frequency base^(-2i/D): the fastest pairs decay the most)."""
    i = torch.arange(head_dim // 2, dtype=torch.float64)
    return (i / (head_dim / 2) + XPOS_GAMMA) / (1 + XPOS_GAMMA)


def xpos_rotate(x: Tensor, base: float, downscale: bool) -> Tensor:
    """xPos on x [B, H, T, D]: the rotary rotation at positions 0..T-1 (base ``base``) and each
    pair scaled by zeta_i^(t / 512) (a query), or zeta_i^(-t / 512) (a key, ``downscale``). The
    positions enter the scale from the window's middle, t - T // 2, as the paper's code does:
    the score q_n . k_m carries zeta^((n - m) / 512) whatever the offset, and the factors stay
    near 1."""
    T, D = x.shape[-2], x.shape[-1]
    pos = torch.arange(T, dtype=torch.float64, device=x.device)
    inv_freq = base ** (-torch.arange(0, D, 2, dtype=torch.float64, device=x.device) / D)
    angles = pos[:, None] * inv_freq[None, :]  # (T, D/2)
    power = (pos - T // 2)[:, None] / XPOS_SCALE_BASE  # (T, 1)
    scale = xpos_zeta(D).to(x.device)[None, :] ** (-power if downscale else power)  # (T, D/2)
    scale = torch.cat((scale, scale), dim=-1).to(x.dtype)  # (T, D): both halves of each pair
    return rotate(x, angles) * scale
