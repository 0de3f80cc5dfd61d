"""Evaluation-time length tricks for an encoder trained with plain softmax attention (Attention-O).

Each trick changes only how attention is computed at evaluation, never the weights: the trained
O model's state dict loads unchanged into a model whose mixers are :class:`TrickMixer` (same
parameter names as :class:`attnbench.layers.AttentionMixer`: ``wq, wk, wv, wo``). L is the
training length, n the length of the window being evaluated, s = max(1, n / L), d the head dim.

======== ====================================================================================
logn     scores times max(1, log n_i / log L), n_i the keys query i sees (Su 2021's log_L n,
         clipped as Su 2021 advises for use beyond the trained length; Qwen's logn-attn)
temperature scores times (0.1 ln s + 1)^2: YaRN's attention temperature alone (Peng et al.
         2023), without its interpolation: not YaRN
yarn     YaRN (Peng et al. 2023) in full: each rotary frequency theta_i interpolated by parts,
         theta_i' = (1 - g) theta_i / s + g theta_i with g = clip((r_i - alpha) / (beta -
         alpha), 0, 1) and r_i = L theta_i / 2 pi the turns pair i makes over the training
         length (alpha = 1, beta = 32: the paper's defaults), plus the temperature above
local    query i sees keys j with abs(i - j) <= local_window (L/2 by default), dense -inf mask
chunk    the window is cut into independent L-token chunks (the sanity floor; done by the
         evaluator, the mixer itself is plain)
ntk      rotary base times s^(d / (d - 2)): NTK-aware scaling (bloc97, 2023)
pi       positions times min(1, L / n): position interpolation (Chen et al. 2023)
rerope   relative positions clipped to +-w (w = rerope_window, L/2 by default): ReRoPE (Su 2023),
         needs the scores with and without rotation, so it is dense and evaluation-only
======== ====================================================================================

Tricks compose with ``+`` (``ntk+logn``, ``rerope+logn`` as in Su's own ReRoPE code), except
``chunk``, which stands alone; at most one of ``ntk``, ``pi`` and ``yarn`` (each sets the rotary
frequencies), and ``yarn`` already holds ``temperature``. The dense path
spells everything out (and feeds the entropy probe); the same computation through SDPA, with the
row scale folded into q and the window as a boolean mask, evaluates the rest of the windows
faster. ReRoPE is dense only. An evaluation tool, not a training path.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnbench.core.errors import AttnbenchError, unknown
from attnbench.layers import Rotary

#: YaRN's ramp: pairs making fewer than alpha turns over the training length are interpolated
#: fully, more than beta not at all (Peng et al. 2023's defaults for LLaMA).
YARN_ALPHA, YARN_BETA = 1.0, 32.0
#: Names that set the rotary frequencies: at most one per row.
ROTARY_TRICKS = ("ntk", "pi", "yarn")
#: Old names, and what they are called now.
RENAMED = {"yarn-temp": "temperature"}

TRICKS: dict[str, str] = {
    "logn": "scores x max(1, log n / log L) (Su 2021's log_L n, clipped)",
    "temperature": "scores x (0.1 ln(n/L) + 1)^2 (YaRN's temperature alone, not YaRN)",
    "yarn": f"YaRN: rotary frequencies interpolated by parts (alpha={YARN_ALPHA:g}, "
    f"beta={YARN_BETA:g}) + scores x (0.1 ln(n/L) + 1)^2",
    "local": "local window: each query sees keys within +-local_window (L/2)",
    "chunk": "independent L-chunks (sanity floor)",
    "ntk": "NTK-aware rotary base: base x (n/L)^(d/(d-2))",
    "pi": "position interpolation: positions x L/n",
    "rerope": "ReRoPE: relative positions clipped at +-rerope_window (L/2)",
}


@dataclass(frozen=True)
class Tricks:
    """A set of evaluation-time tricks (see the module docstring) and their windows."""

    names: tuple[str, ...]
    train_len: int
    local_window: int
    rerope_window: int

    @property
    def label(self) -> str:
        return "+".join(self.names)

    @property
    def chunk(self) -> bool:
        return "chunk" in self.names

    def has(self, name: str) -> bool:
        return name in self.names

    def describe(self) -> str:
        parts = []
        for name in self.names:
            text = TRICKS[name]
            if name == "local":
                text = text.replace("(L/2)", f"({self.local_window})")
            if name == "rerope":
                text = text.replace("(L/2)", f"({self.rerope_window})")
            parts.append(text)
        return "; ".join(parts)


def parse_tricks(
    text: str, train_len: int, local_window: int | None = None, rerope_window: int | None = None
) -> Tricks:
    """``"ntk+logn"`` -> Tricks. Windows default to L/2."""
    names = tuple(t.strip() for t in text.split("+") if t.strip())
    if not names:
        raise AttnbenchError(f"empty evaluation-time row {text!r}; known: {', '.join(TRICKS)}")
    for name in names:
        if name in RENAMED:
            raise AttnbenchError(
                f"evaluation-time trick {name!r} is now called {RENAMED[name]!r} (it is YaRN's "
                "temperature alone); 'yarn' is YaRN in full"
            )
        if name not in TRICKS:
            raise unknown("evaluation-time trick", name, list(TRICKS))
    rotary = [n for n in names if n in ROTARY_TRICKS]
    if len(rotary) > 1:
        raise AttnbenchError(
            f"evaluation-time row {text!r} sets the rotary frequencies twice "
            f"({', '.join(rotary)}); accepted: at most one of {', '.join(ROTARY_TRICKS)}"
        )
    if "yarn" in names and "temperature" in names:
        raise AttnbenchError(f"evaluation-time row {text!r}: yarn already holds the temperature")
    if len(set(names)) != len(names):
        raise AttnbenchError(f"evaluation-time row {text!r} names a trick twice")
    if "chunk" in names and len(names) > 1:
        raise AttnbenchError(f"evaluation-time row {text!r}: chunk stands alone")
    half = max(1, train_len // 2)
    local_window = half if local_window is None else local_window
    rerope_window = half if rerope_window is None else rerope_window
    for key, value in (("local_window", local_window), ("rerope_window", rerope_window)):
        if value < 1:
            raise AttnbenchError(f"invalid {key}={value}; accepted: an integer >= 1")
    return Tricks(names, train_len, local_window, rerope_window)


def yarn_temperature(s: float) -> float:
    """YaRN's logit factor 1/t = (0.1 ln s + 1)^2 for an extension s = n / L (1 for s <= 1)."""
    return (0.1 * math.log(max(1.0, s)) + 1.0) ** 2


def yarn_freq_scale(
    dim: int,
    base: float,
    train_len: int,
    s: float,
    alpha: float = YARN_ALPHA,
    beta: float = YARN_BETA,
) -> Tensor:
    """YaRN's factor on each rotary frequency [D/2] (float64) for an extension s = n / L:
    (1 - g) / s + g, g = clip((r - alpha) / (beta - alpha), 0, 1), r = L theta / (2 pi) the turns
    the pair makes over the training length. 1 everywhere for s <= 1."""
    theta = Rotary(dim, base=base).inv_freq()  # (D/2,) float64
    turns = train_len * theta / (2 * math.pi)  # (D/2,)
    g = ((turns - alpha) / (beta - alpha)).clamp(0.0, 1.0)
    return (1 - g) / max(1.0, s) + g


def rotate(x: Tensor, angles: Tensor) -> Tensor:
    """Rotary rotation of x [B, H, T, D] by angles [T, D/2] (or [1, D/2]), in Rotary's layout:
    pairs (x[..., i], x[..., i + D/2])."""
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)  # (T, D/2)
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)  # (B, H, T, D)


#: Called with the attention probabilities [B, H, T, T] of one forward pass (entropy probes).
ProbsHook = Callable[[Tensor], None]


class TrickMixer(nn.Module):
    """Dense softmax attention with evaluation-time tricks; x [B, T, C] -> [B, T, C].

    Parameter names match AttentionMixer's for the ``softmax`` mechanism, so a trained O model's
    weights load into it as they are. q, k, v: [B, H, T, D].
    """

    def __init__(
        self, d_model: int, heads: int, tricks: Tricks, *, rope_base: float = 10000.0
    ) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, d_model // heads
        self.tricks, self.rope_base = tricks, rope_base
        self.wq = nn.Linear(d_model, d_model, bias=False)
        self.wk = nn.Linear(d_model, d_model, bias=False)
        self.wv = nn.Linear(d_model, d_model, bias=False)
        self.wo = nn.Linear(d_model, d_model, bias=False)
        self.probs_hook: ProbsHook | None = None
        #: Always take the dense path (tests compare it with the SDPA one).
        self.force_dense = False

    def rotary(self, n: int) -> Rotary:
        """The rotary embedding used at length n (NTK base and interpolation applied)."""
        D, L = self.head_dim, self.tricks.train_len
        s = max(1.0, n / L)
        base = self.rope_base * s ** (D / (D - 2)) if self.tricks.has("ntk") else self.rope_base
        scale = min(1.0, L / n) if self.tricks.has("pi") else 1.0
        freq = yarn_freq_scale(D, self.rope_base, L, s) if self.tricks.has("yarn") else None
        return Rotary(D, base=base, position_scale=scale, freq_scale=freq)

    def scores(self, q: Tensor, k: Tensor) -> Tensor:
        """Raw (unscaled) rotary scores [B, H, T, T], with ReRoPE's clipping when asked."""
        T = q.shape[-2]
        rot = self.rotary(T)
        pos = torch.arange(T, device=q.device)
        ang = rot.angles(pos).to(q.device)  # (T, D/2)
        s = rotate(q, ang) @ rotate(k, ang).transpose(-2, -1)  # (B, H, T, T)
        if self.tricks.has("rerope"):
            w = self.tricks.rerope_window
            # Score at relative position r = i - j is rotate(q, r) . k: clip r to [-w, w].
            far = rot.angles(torch.tensor([float(w), float(-w)])).to(q.device)  # (2, D/2)
            s_pos = rotate(q, far[:1]) @ k.transpose(-2, -1)  # (B, H, T, T), r = +w
            s_neg = rotate(q, far[1:]) @ k.transpose(-2, -1)  # (B, H, T, T), r = -w
            rel = pos[:, None] - pos[None, :]  # (T, T)
            s = torch.where(rel >= w, s_pos, torch.where(rel <= -w, s_neg, s))
        return s

    def row_factors(self, T: int, device: torch.device) -> tuple[Tensor, Tensor | None]:
        """The per-row score scale [T, 1] (float64) and the visibility mask [T, T] (or None)."""
        D, L = self.head_dim, self.tricks.train_len
        pos = torch.arange(T, device=device)
        visible = None
        n_keys = torch.full((T, 1), float(T), dtype=torch.float64, device=device)
        if self.tricks.has("local"):
            visible = (pos[:, None] - pos[None, :]).abs() <= self.tricks.local_window  # (T, T)
            n_keys = visible.sum(-1, keepdim=True).to(torch.float64)  # (T, 1)
        factor = torch.full_like(n_keys, 1.0 / math.sqrt(D))  # (T, 1)
        if self.tricks.has("logn"):
            factor = factor * (n_keys.log() / math.log(L)).clamp(min=1.0)
        if self.tricks.has("temperature") or self.tricks.has("yarn"):
            factor = factor * yarn_temperature(T / L)
        return factor, visible

    def dense(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """Scores, scale, mask and softmax spelled out; the probabilities go to ``probs_hook``.
        q, k, v: [B, H, T, D] (unrotated)."""
        factor, visible = self.row_factors(q.shape[-2], q.device)
        s = self.scores(q, k) * factor.to(q.dtype)  # (B, H, T, T), row i scaled
        if visible is not None:
            s = s.masked_fill(~visible, float("-inf"))
        probs = torch.softmax(s, dim=-1)  # (B, H, T, T)
        if self.probs_hook is not None:
            self.probs_hook(probs)
        return probs @ v  # (B, H, T, D)

    def fused(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """The same through SDPA (row scale folded into q, mask as attn_mask): every trick but
        ReRoPE, which needs two score matrices. q, k, v: [B, H, T, D] (unrotated)."""
        T = q.shape[-2]
        factor, visible = self.row_factors(T, q.device)
        ang = self.rotary(T).angles(torch.arange(T)).to(q.device)  # (T, D/2)
        q = rotate(q, ang) * factor.to(q.dtype)  # (B, H, T, D), row i scaled
        k = rotate(k, ang)  # (B, H, T, D)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=visible, scale=1.0)

    def forward(self, x: Tensor) -> Tensor:
        B, T, C = x.shape
        H, D = self.heads, self.head_dim
        q = self.wq(x).view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
        k = self.wk(x).view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
        v = self.wv(x).view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
        if self.probs_hook is not None or self.tricks.has("rerope") or self.force_dense:
            o = self.dense(q, k, v)  # (B, H, T, D)
        else:
            o = self.fused(q, k, v)  # (B, H, T, D)
        return self.wo(o.transpose(1, 2).reshape(B, T, C))
