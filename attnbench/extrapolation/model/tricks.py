"""Evaluation-time length tricks for an encoder trained with plain softmax attention (Attention-O).

Each trick changes only how attention is computed at evaluation, never the weights: the trained
O model's state dict loads unchanged into a model whose mixers are :class:`TrickMixer` (same
parameter names as :class:`attnbench.layers.AttentionMixer`: ``wq, wk, wv, wo``). L is the
training length, n the length of the window being evaluated, s = max(1, n / L), d the head dim,
r = i - j the relative position of key j to query i, w = the row's own window ``@W``
(``rerope@48``) or else the run's ``rerope_window`` (L/2 by default).

======== ====================================================================================
logn     scores times max(1, log n_i / log L)^p, n_i the keys query i sees (Su 2021's log_L n,
         clipped as Su 2021 advises for use beyond the trained length; Qwen's logn-attn);
         ``logn^P`` sets the power p (``logn`` is p = 1): ``logn^2`` is a sharper length
         temperature
temperature scores times (0.1 ln s + 1)^2: YaRN's attention temperature alone (Peng et al.
         2023), without its interpolation: not YaRN
yarn     YaRN, the paper's equation (Peng et al. 2023): each rotary frequency theta_i
         interpolated by parts, theta_i' = (1 - g) theta_i / s + g theta_i with g = clip((r_i -
         alpha) / (beta - alpha), 0, 1) and r_i = L theta_i / 2 pi the turns pair i makes over
         the training length (alpha = ``yarn_alpha`` = 1, beta = ``yarn_beta`` = 32: the
         paper's values, set for LLaMA's L = 4096; at L = 64 no pair makes 32 turns, so every
         pair is interpolated, at least in part), plus the temperature above
yarn-dim YaRN as its reference code (jquesnelle/yarn) and Hugging Face Transformers'
         ``_compute_yarn_parameters`` compute it: the ramp runs over the pair index i, not the
         turns. c(b) = d ln(L / (2 pi b)) / (2 ln base) is the pair making b turns over L; low =
         floor(c(beta_fast)), high = ceil(c(beta_slow)), clamped to [0, d - 1] as that code
         does (d - 1, not d/2 - 1: the two differ only when high > d/2 - 1, which with
         beta_slow = 1 needs L > 2 pi base^(1 - 2/d), 47,000 at d = 64, base = 10^4); ramp_i =
         clip((i - low) / (high - low), 0, 1) (high raised by 0.001 when equal to low, as
         there); theta_i' = (1 - ramp_i) theta_i + ramp_i theta_i / s: pairs below low (the
         fastest) keep their frequency, pairs from high on are divided by s; beta_fast =
         ``yarn_beta_fast`` = 32, beta_slow = ``yarn_beta_slow`` = 1 (that code's defaults);
         plus the temperature above
local    query i sees keys j with abs(i - j) <= local_window (L/2 by default), dense -inf mask
chunk    the window is cut into independent L-token chunks (the sanity floor; done by the
         evaluator, the mixer itself is plain)
ntk      rotary base times s^(d / (d - 2)): NTK-aware scaling (bloc97, 2023)
pi       positions times min(1, L / n): position interpolation (Chen et al. 2023)
rerope   relative positions clipped to +-w: ReRoPE (Su 2023, ReRoPE), needs the scores with and
         without rotation, so it is dense and evaluation-only. Any w >= 1 works; w = L keeps
         every trained distance 0..L-1 (farther keys sit at L), w >= n - 1 is plain RoPE.
         ``rerope@W`` sets w = W for that row only (``rerope@63+logn`` beside ``rerope+logn``)
leaky    Leaky ReRoPE (Su 2023, ReRoPE): r kept when abs(r) < w, else sign(r) (w + (abs(r) -
         w) / k). The score at a fractional relative position comes from q rotated to (i +- w
         (k - 1)) / k and k rotated to j / k (Su's own code): three score matrices, dense,
         evaluation-only. k = ``leaky_k``; by default (leaky_k = 0) k depends on n: k = max(1,
         (n - 1 - w) / (L - 1 - w)), the least compression that maps the farthest key (abs(r) =
         n - 1) to L - 1, inside the trained range. Su's patch keeps that range too (L = 4096,
         w = 512, k = 16 and 16k tokens: the farthest key lands at 1504), but a fixed k = 16 at
         L = 64, w = 32 leaves it beyond n = 529; needs w < L - 1 when k is chosen per n.
         ``leaky@W`` sets w = W for that row only, as ``rerope@W``
hwfa     HWFA (Su 2023, HWFA; Su 2023, HWFA meets ReRoPE): keys within +-local_window in every
         layer but the last, full attention scaled by max(1, log n / log L) in the last: global
         through depth only. Su trains HWFA's last layer without positions (NoPE); the O
         weights here have RoPE in every layer, so the last keeps it (``hwfa+rerope`` clips
         it: the second post's pairing). Plain O for n <= min(local_window + 1, L)
======== ====================================================================================

Tricks compose with ``+`` (``ntk+logn``, ``rerope+logn`` as in Su's own ReRoPE code,
``rerope+logn^2``, ``rerope@48+logn``), except ``chunk``, which stands alone; at most one of
``ntk``, ``pi``, ``yarn`` and ``yarn-dim`` (each sets the rotary frequencies), at most one of
``rerope`` and ``leaky`` (each remaps r); ``yarn`` and ``yarn-dim`` already hold
``temperature``, ``hwfa`` already holds ``local`` and ``logn``. The dense path spells everything
out (and feeds the entropy probe); the same computation through SDPA, with the row scale folded
into q and the window as a boolean mask, evaluates the rest of the windows faster. ReRoPE and
Leaky ReRoPE are dense only. An evaluation tool, not a training path.

Sources of the rows (short forms as in :mod:`attnbench.core.sources`):

- Su 2021: Su Jianlin, "Looking at attention's scale operation from entropy invariance (in
  Chinese)", 2021, https://kexue.fm/archives/8823 (the log n scale)
- Peng et al. 2023: Bowen Peng, Jeffrey Quesnelle, Honglu Fan, Enrico Shippole, "YaRN: Efficient
  Context Window Extension of Large Language Models", 2023, https://arxiv.org/abs/2309.00071;
  the reference code https://github.com/jquesnelle/yarn (``yarn-dim`` follows its
  ``_yarn_find_correction_range``, as Hugging Face Transformers' ``_compute_yarn_parameters``)
- Su 2023, ReRoPE: Su Jianlin, "Transformer升级之路：12、无限外推的ReRoPE？" (ReRoPE, infinite
  extrapolation), 2023, https://kexue.fm/archives/9708, with the code
  https://github.com/bojone/rerope (``rerope_patch.py``, ``leaky_rerope_patch.py``)
- Su 2023, HWFA: Su Jianlin, "Transformer升级之路：9、一种全局长度外推的新思路" (a new idea for
  global length extrapolation), 2023, https://kexue.fm/archives/9603
- Su 2023, HWFA meets ReRoPE: Su Jianlin, "Transformer升级之路：14、当HWFA遇见ReRoPE", 2023,
  https://kexue.fm/archives/9731
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

#: YaRN's ramp in the paper's form: pairs making fewer than alpha turns over the training length
#: are interpolated fully, more than beta not at all (Peng et al. 2023's values for LLaMA).
YARN_ALPHA, YARN_BETA = 1.0, 32.0
#: YaRN's ramp as its code computes it: the pairs making beta_fast and beta_slow turns over L
#: bound the ramp over the pair index (jquesnelle/yarn's and Transformers' defaults).
YARN_BETA_FAST, YARN_BETA_SLOW = 32.0, 1.0
#: Leaky ReRoPE's k: 0 chooses it per n (see the module docstring).
LEAKY_AUTO = 0.0
#: Names that set the rotary frequencies: at most one per row.
ROTARY_TRICKS = ("ntk", "pi", "yarn", "yarn-dim")
#: Names that remap the relative positions: at most one per row.
RELATIVE_TRICKS = ("rerope", "leaky")
#: What a name already holds, so naming both is refused.
HOLDS = {"yarn": ("temperature",), "yarn-dim": ("temperature",), "hwfa": ("local", "logn")}
#: Old names, and what they are called now.
RENAMED = {"yarn-temp": "temperature"}
#: ``logn^P``: the log n scale to the power P.
LOGN_POWER_PREFIX = "logn^"
#: ``rerope@W``, ``leaky@W``: the row's own window w = W (a relative trick only).
WINDOW_MARK = "@"

TRICKS: dict[str, str] = {
    "logn": "scores x max(1, log n / log L)^p (Su 2021's log_L n, clipped; logn^P: p = P)",
    "temperature": "scores x (0.1 ln(n/L) + 1)^2 (YaRN's temperature alone, not YaRN)",
    "yarn": "YaRN, the paper's equation: frequencies interpolated by parts, ramp in turns "
    "r = L/lambda (alpha, beta set for L = 4096: at L = 64 every pair is interpolated) "
    "+ scores x (0.1 ln(n/L) + 1)^2",
    "yarn-dim": "YaRN as its code and HF Transformers compute it: ramp over the pair index "
    "between the pairs making beta_fast and beta_slow turns over L + scores x (0.1 ln(n/L) + 1)^2",
    "local": "local window: each query sees keys within +-local_window (L/2)",
    "chunk": "independent L-chunks (sanity floor)",
    "ntk": "NTK-aware rotary base: base x (n/L)^(d/(d-2))",
    "pi": "position interpolation: positions x L/n",
    "rerope": "ReRoPE: relative positions clipped at +-rerope_window (L/2; rerope@W: W)",
    "leaky": "Leaky ReRoPE: relative positions beyond +-rerope_window (L/2; leaky@W: W) "
    "compressed by 1/k",
    "hwfa": "HWFA: keys within +-local_window (L/2) in every layer but the last, full attention "
    "x max(1, log n / log L) in the last (global through depth only)",
}
#: Every accepted spelling, for error messages.
ACCEPTED = [*TRICKS, "logn^P (P > 0)", "rerope@W and leaky@W (W an integer >= 1)"]


@dataclass(frozen=True)
class Tricks:
    """A set of evaluation-time tricks (see the module docstring), their windows and settings."""

    names: tuple[str, ...]
    train_len: int
    local_window: int
    rerope_window: int
    yarn_alpha: float = YARN_ALPHA
    yarn_beta: float = YARN_BETA
    yarn_beta_fast: float = YARN_BETA_FAST
    yarn_beta_slow: float = YARN_BETA_SLOW
    leaky_k: float = LEAKY_AUTO
    #: The power p of ``logn^P`` (1 for ``logn``).
    logn_power: float = 1.0
    #: Whether ``rerope_window`` is the row's own ``@W`` (spelled in the label: ``rerope@48``)
    #: rather than the run's setting.
    window_from_row: bool = False

    @property
    def label(self) -> str:
        return "+".join(self._spelled(name) for name in self.names)

    @property
    def chunk(self) -> bool:
        return "chunk" in self.names

    def has(self, name: str) -> bool:
        return name in self.names

    def _spelled(self, name: str) -> str:
        if name == "logn" and self.logn_power != 1:
            return f"{LOGN_POWER_PREFIX}{self.logn_power:g}"
        if name in RELATIVE_TRICKS and self.window_from_row:
            return f"{name}{WINDOW_MARK}{self.rerope_window}"
        return name

    def _window_text(self, name: str, text: str) -> str:
        """``name``'s description with its window filled in: ``+-rerope_window (32)`` as
        before when the run sets it, ``+-48 (the row's @48)`` when the row does."""
        w, generic = self.rerope_window, f"(L/2; {name}{WINDOW_MARK}W: W)"
        if self.window_from_row:
            return text.replace(f"rerope_window {generic}", f"{w} (the row's {WINDOW_MARK}{w})")
        return text.replace(generic, f"({w})")

    def leaky_factor(self, n: int) -> float:
        """Leaky ReRoPE's k at length n: ``leaky_k``, or the least k >= 1 that maps the farthest
        key (abs(r) = n - 1) to L - 1 when it is 0."""
        if self.leaky_k != LEAKY_AUTO:
            return self.leaky_k
        w, L = self.rerope_window, self.train_len
        return max(1.0, (n - 1 - w) / (L - 1 - w))

    def parameters(self, name: str) -> str:
        """The settings ``name`` reads, as ``key=value`` (empty when none)."""
        per_n = "per n, (n - 1 - w) / (L - 1 - w)"
        leaky = per_n if self.leaky_k == LEAKY_AUTO else f"{self.leaky_k:g}"
        window = f"rerope_window={self.rerope_window}"
        if self.window_from_row:
            window += f" (the row's {WINDOW_MARK}{self.rerope_window})"
        values = {
            "logn": f"p={self.logn_power:g}",
            "yarn": f"yarn_alpha={self.yarn_alpha:g}, yarn_beta={self.yarn_beta:g}",
            "yarn-dim": f"yarn_beta_fast={self.yarn_beta_fast:g}, "
            f"yarn_beta_slow={self.yarn_beta_slow:g}",
            "local": f"local_window={self.local_window}",
            "rerope": window,
            "leaky": f"{window}, leaky_k={leaky}",
            "hwfa": f"local_window={self.local_window}",
        }
        return values.get(name, "")

    def describe(self) -> str:
        """Each trick's description with its settings (what the sidecar and the CSV record)."""
        parts = []
        for name in self.names:
            text = TRICKS[name]
            if name in ("local", "hwfa"):
                text = text.replace("(L/2)", f"({self.local_window})")
            if name in RELATIVE_TRICKS:
                text = self._window_text(name, text)
            params = self.parameters(name)
            parts.append(f"{text} [{params}]" if params else text)
        return "; ".join(parts)


def settings_problem(
    yarn_alpha: float = YARN_ALPHA,
    yarn_beta: float = YARN_BETA,
    yarn_beta_fast: float = YARN_BETA_FAST,
    yarn_beta_slow: float = YARN_BETA_SLOW,
    leaky_k: float = LEAKY_AUTO,
) -> tuple[str, str] | None:
    """(the setting at fault, why) when the trick settings do not make sense together, else
    None: the ramps need beta above alpha (beta_fast above beta_slow), positive turn counts, and
    leaky_k is 0 (per n) or at least 1 (k < 1 would stretch distances)."""
    values = dict(yarn_alpha=yarn_alpha, yarn_beta=yarn_beta, yarn_beta_fast=yarn_beta_fast,
                  yarn_beta_slow=yarn_beta_slow, leaky_k=leaky_k)  # fmt: skip
    for key, value in values.items():
        if not math.isfinite(value):
            return key, f"invalid {key}={value}; accepted: a finite number"
    if yarn_alpha < 0 or yarn_beta <= yarn_alpha:
        return "yarn_beta", (
            f"invalid yarn_alpha={yarn_alpha:g}, yarn_beta={yarn_beta:g}; accepted: "
            "0 <= yarn_alpha < yarn_beta"
        )
    if yarn_beta_slow <= 0 or yarn_beta_fast <= yarn_beta_slow:
        return "yarn_beta_fast", (
            f"invalid yarn_beta_fast={yarn_beta_fast:g}, yarn_beta_slow={yarn_beta_slow:g}; "
            "accepted: 0 < yarn_beta_slow < yarn_beta_fast"
        )
    if leaky_k != LEAKY_AUTO and leaky_k < 1:
        return "leaky_k", f"invalid leaky_k={leaky_k:g}; accepted: 0 (k chosen per n) or >= 1"
    return None


def _split_row(text: str) -> tuple[tuple[str, ...], float, int | None]:
    """``"rerope@48+logn^2"`` -> (("rerope", "logn"), 2.0, 48): the trick names, logn's power
    and the row's own ReRoPE window (None: the run's)."""
    names, power, window = [], 1.0, None
    for token in (t.strip() for t in text.split("+")):
        if not token:
            continue
        name, marked, window_text = token.partition(WINDOW_MARK)
        if name.startswith(LOGN_POWER_PREFIX):
            power = _logn_power(name)
            name = "logn"
        if name in RENAMED:
            raise AttnbenchError(
                f"evaluation-time trick {name!r} is now called {RENAMED[name]!r} (it is YaRN's "
                "temperature alone); 'yarn' is YaRN in full"
            )
        if name not in TRICKS:
            raise unknown("evaluation-time trick", name, ACCEPTED)
        if marked:
            window = _row_window(token, name, window_text)
        names.append(name)
    if not names:
        raise AttnbenchError(f"empty evaluation-time row {text!r}; known: {', '.join(ACCEPTED)}")
    return tuple(names), power, window


def _row_window(token: str, name: str, text: str) -> int:
    """The W of ``rerope@W`` / ``leaky@W``: an integer >= 1, on a trick that remaps r."""
    if name not in RELATIVE_TRICKS:
        raise AttnbenchError(
            f"evaluation-time trick {token!r}: only {' and '.join(RELATIVE_TRICKS)} take a "
            "window @W; accepted: rerope@W, leaky@W (W an integer >= 1), e.g. rerope@48"
        )
    if not (text.isascii() and text.isdigit() and int(text) >= 1):
        raise AttnbenchError(
            f"evaluation-time trick {token!r}: the window W of {name}@W must be an integer "
            f">= 1; accepted: {name}@W, e.g. {name}@48"
        )
    return int(text)


def _logn_power(name: str) -> float:
    """The P of ``logn^P``: a finite number > 0."""
    try:
        power = float(name[len(LOGN_POWER_PREFIX) :])
    except ValueError:
        power = math.nan
    if not (math.isfinite(power) and power > 0):
        raise AttnbenchError(
            f"evaluation-time trick {name!r}: the power of logn^P must be a number > 0; "
            f"accepted: {', '.join(ACCEPTED)} (e.g. logn^2)"
        )
    return power


def _check_combination(text: str, names: tuple[str, ...]) -> None:
    """Refuse a row whose tricks overlap or conflict (see the module docstring)."""
    if len(set(names)) != len(names):
        raise AttnbenchError(f"evaluation-time row {text!r} names a trick twice")
    for group, what in ((ROTARY_TRICKS, "sets the rotary frequencies"),
                        (RELATIVE_TRICKS, "remaps the relative positions")):  # fmt: skip
        named = [n for n in names if n in group]
        if len(named) > 1:
            raise AttnbenchError(
                f"evaluation-time row {text!r} {what} twice ({', '.join(named)}); "
                f"accepted: at most one of {', '.join(group)}"
            )
    for name, held in HOLDS.items():
        both = [h for h in held if name in names and h in names]
        if both:
            held_text = " and ".join("the temperature" if h == "temperature" else repr(h)
                                     for h in both)  # fmt: skip
            raise AttnbenchError(
                f"evaluation-time row {text!r}: {name} already holds {held_text}; accepted: "
                f"{name} without {' and '.join(both)}"
            )
    if "chunk" in names and len(names) > 1:
        raise AttnbenchError(f"evaluation-time row {text!r}: chunk stands alone")


def parse_tricks(
    text: str,
    train_len: int,
    local_window: int | None = None,
    rerope_window: int | None = None,
    *,
    yarn_alpha: float = YARN_ALPHA,
    yarn_beta: float = YARN_BETA,
    yarn_beta_fast: float = YARN_BETA_FAST,
    yarn_beta_slow: float = YARN_BETA_SLOW,
    leaky_k: float = LEAKY_AUTO,
) -> Tricks:
    """``"ntk+logn"`` -> Tricks. Windows default to L/2; a row's ``rerope@W`` / ``leaky@W``
    overrides ``rerope_window`` for that row only; the other settings default to the sources'."""
    names, power, row_window = _split_row(text)
    _check_combination(text, names)
    half = max(1, train_len // 2)
    local_window = half if local_window is None else local_window
    rerope_window = half if rerope_window is None else rerope_window
    for key, value in (("local_window", local_window), ("rerope_window", rerope_window)):
        if value < 1:
            raise AttnbenchError(f"invalid {key}={value}; accepted: an integer >= 1")
    problem = settings_problem(yarn_alpha, yarn_beta, yarn_beta_fast, yarn_beta_slow, leaky_k)
    if problem is not None:
        raise AttnbenchError(problem[1])
    window = rerope_window if row_window is None else row_window
    if "leaky" in names and leaky_k == LEAKY_AUTO and window >= train_len - 1:
        raise AttnbenchError(_leaky_window_problem(text, train_len, window, row_window is not None))
    return Tricks(names, train_len, local_window, window, yarn_alpha, yarn_beta, yarn_beta_fast,
                  yarn_beta_slow, leaky_k, power, row_window is not None)  # fmt: skip


def _leaky_window_problem(text: str, train_len: int, window: int, from_row: bool) -> str:
    """Why leaky with k chosen per n refuses a window w >= L - 1, naming the row's ``@W`` or the
    run's ``rerope_window``, whichever set it."""
    limit = train_len - 1
    what, smaller = "rerope_window", "a smaller rerope_window"
    if from_row:
        what, smaller = "leaky@W", f"leaky@W with W < {limit}"
    return (
        f"evaluation-time row {text!r}: leaky with k chosen per n maps the farthest key to "
        f"L - 1 = {limit}, which needs {what} < {limit} (it is {window}); accepted: {smaller}, "
        "or leaky_k >= 1"
    )


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
    """YaRN's factor on each rotary frequency [D/2] (float64) for an extension s = n / L, the
    paper's equation: (1 - g) / s + g, g = clip((r - alpha) / (beta - alpha), 0, 1), r = L theta
    / (2 pi) the turns the pair makes over the training length. 1 everywhere for s <= 1."""
    theta = Rotary(dim, base=base).inv_freq()  # (D/2,) float64
    turns = train_len * theta / (2 * math.pi)  # (D/2,)
    g = ((turns - alpha) / (beta - alpha)).clamp(0.0, 1.0)
    return (1 - g) / max(1.0, s) + g


def yarn_correction_pair(dim: int, base: float, train_len: int, turns: float) -> float:
    """The (fractional) pair index whose frequency makes ``turns`` turns over the training
    length: d ln(L / (2 pi turns)) / (2 ln base) (YaRN's code: ``find_correction_dim``)."""
    return dim * math.log(train_len / (turns * 2 * math.pi)) / (2 * math.log(base))


def yarn_dim_freq_scale(
    dim: int,
    base: float,
    train_len: int,
    s: float,
    beta_fast: float = YARN_BETA_FAST,
    beta_slow: float = YARN_BETA_SLOW,
) -> Tensor:
    """YaRN's factor on each rotary frequency [D/2] (float64) as its code computes it: a ramp
    over the pair index from low = floor(pair(beta_fast)) to high = ceil(pair(beta_slow)),
    clamped to [0, d - 1]; (1 - ramp) + ramp / s. 1 everywhere for s <= 1."""
    low = max(math.floor(yarn_correction_pair(dim, base, train_len, beta_fast)), 0)
    high = min(math.ceil(yarn_correction_pair(dim, base, train_len, beta_slow)), dim - 1)
    if low == high:
        high += 0.001  # the reference code's guard against 0 / 0
    pair = torch.arange(dim // 2, dtype=torch.float64)  # (D/2,)
    ramp = ((pair - low) / (high - low)).clamp(0.0, 1.0)  # 0: kept, 1: divided by s
    return (1 - ramp) + ramp / max(1.0, s)


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
    weights load into it as they are. q, k, v: [B, H, T, D]. ``layer`` (this block's index) and
    ``layers`` (how many blocks) are needed by ``hwfa`` only, which treats the last layer apart.
    """

    def __init__(
        self,
        d_model: int,
        heads: int,
        tricks: Tricks,
        *,
        rope_base: float = 10000.0,
        layer: int | None = None,
        layers: int | None = None,
    ) -> None:
        super().__init__()
        if tricks.has("hwfa") and (layer is None or layers is None or not 0 <= layer < layers):
            raise AttnbenchError(
                f"the hwfa row needs each mixer's layer index and the layer count; got "
                f"layer={layer}, layers={layers} (TrickMixer(..., layer=i, layers=n), 0 <= i < n)"
            )
        self.heads, self.head_dim = heads, d_model // heads
        self.tricks, self.rope_base = tricks, rope_base
        self.layer, self.layers = layer, layers
        self.wq = nn.Linear(d_model, d_model, bias=False)
        self.wk = nn.Linear(d_model, d_model, bias=False)
        self.wv = nn.Linear(d_model, d_model, bias=False)
        self.wo = nn.Linear(d_model, d_model, bias=False)
        self.probs_hook: ProbsHook | None = None
        #: Always take the dense path (tests compare it with the SDPA one).
        self.force_dense = False

    @property
    def windowed(self) -> bool:
        """Whether queries see only keys within +-local_window here (``local``, or ``hwfa``
        below its last layer)."""
        below_last = self.tricks.has("hwfa") and self.layer != self.layers - 1
        return self.tricks.has("local") or below_last

    @property
    def log_scaled(self) -> bool:
        """Whether scores are scaled by max(1, log n / log L)^p here (``logn``, or ``hwfa`` in
        its last layer)."""
        last = self.tricks.has("hwfa") and self.layer == self.layers - 1
        return self.tricks.has("logn") or last

    @property
    def dense_only(self) -> bool:
        """ReRoPE and Leaky ReRoPE need several score matrices: no SDPA path."""
        return any(self.tricks.has(name) for name in RELATIVE_TRICKS)

    def rotary(self, n: int) -> Rotary:
        """The rotary embedding used at length n (NTK base, interpolation, YaRN applied)."""
        D, L, t = self.head_dim, self.tricks.train_len, self.tricks
        s = max(1.0, n / L)
        base = self.rope_base * s ** (D / (D - 2)) if t.has("ntk") else self.rope_base
        scale = min(1.0, L / n) if t.has("pi") else 1.0
        freq = None
        if t.has("yarn"):
            freq = yarn_freq_scale(D, self.rope_base, L, s, t.yarn_alpha, t.yarn_beta)
        if t.has("yarn-dim"):
            freq = yarn_dim_freq_scale(D, self.rope_base, L, s, t.yarn_beta_fast, t.yarn_beta_slow)
        return Rotary(D, base=base, position_scale=scale, freq_scale=freq)

    def scores(self, q: Tensor, k: Tensor) -> Tensor:
        """Raw (unscaled) rotary scores [B, H, T, T], with ReRoPE's or Leaky ReRoPE's remapping
        of the relative positions when asked."""
        T = q.shape[-2]
        rot = self.rotary(T)
        pos = torch.arange(T, device=q.device)
        ang = rot.angles(pos).to(q.device)  # (T, D/2)
        s = rotate(q, ang) @ rotate(k, ang).transpose(-2, -1)  # (B, H, T, T)
        if self.tricks.has("rerope"):
            s = self._rerope(q, k, rot, s)
        if self.tricks.has("leaky") and self.tricks.leaky_factor(T) != 1:
            s = self._leaky(q, k, rot, s)
        return s

    def _far(self, q: Tensor, k: Tensor, s: Tensor, s_pos: Tensor, s_neg: Tensor) -> Tensor:
        """s where abs(r) < w, s_pos where r >= w, s_neg where r <= -w: [B, H, T, T]."""
        w, T = self.tricks.rerope_window, q.shape[-2]
        pos = torch.arange(T, device=q.device)
        rel = pos[:, None] - pos[None, :]  # (T, T)
        return torch.where(rel >= w, s_pos, torch.where(rel <= -w, s_neg, s))

    def _rerope(self, q: Tensor, k: Tensor, rot: Rotary, s: Tensor) -> Tensor:
        """ReRoPE: beyond +-w the score at relative position +-w."""
        w = self.tricks.rerope_window
        # Score at relative position r = i - j is rotate(q, r) . k: clip r to [-w, w].
        far = rot.angles(torch.tensor([float(w), float(-w)])).to(q.device)  # (2, D/2)
        s_pos = rotate(q, far[:1]) @ k.transpose(-2, -1)  # (B, H, T, T), r = +w
        s_neg = rotate(q, far[1:]) @ k.transpose(-2, -1)  # (B, H, T, T), r = -w
        return self._far(q, k, s, s_pos, s_neg)

    def _leaky(self, q: Tensor, k: Tensor, rot: Rotary, s: Tensor) -> Tensor:
        """Leaky ReRoPE: beyond +-w the score at relative position +-(w + (abs(r) - w) / k).
        Query i rotated to (i +- w (k - 1)) / k and key j to j / k give exactly that (Su's
        code): ReRoPE's clipping is the limit k -> inf."""
        T, w = q.shape[-2], self.tricks.rerope_window
        lk = self.tricks.leaky_factor(T)
        pos = torch.arange(T, dtype=torch.float64)  # (T,)
        k_rot = rotate(k, rot.angles(pos / lk).to(q.device))  # (B, H, T, D), key j at j / k
        shift = w * (lk - 1)
        q_pos = rotate(q, rot.angles((pos + shift) / lk).to(q.device))  # (B, H, T, D)
        q_neg = rotate(q, rot.angles((pos - shift) / lk).to(q.device))  # (B, H, T, D)
        s_pos = q_pos @ k_rot.transpose(-2, -1)  # (B, H, T, T), r >= w
        s_neg = q_neg @ k_rot.transpose(-2, -1)  # (B, H, T, T), r <= -w
        return self._far(q, k, s, s_pos, s_neg)

    def row_factors(self, T: int, device: torch.device) -> tuple[Tensor, Tensor | None]:
        """The per-row score scale [T, 1] (float64) and the visibility mask [T, T] (or None)."""
        D, L, t = self.head_dim, self.tricks.train_len, self.tricks
        pos = torch.arange(T, device=device)
        visible = None
        n_keys = torch.full((T, 1), float(T), dtype=torch.float64, device=device)
        if self.windowed:
            visible = (pos[:, None] - pos[None, :]).abs() <= t.local_window  # (T, T)
            n_keys = visible.sum(-1, keepdim=True).to(torch.float64)  # (T, 1)
        factor = torch.full_like(n_keys, 1.0 / math.sqrt(D))  # (T, 1)
        if self.log_scaled:
            factor = factor * (n_keys.log() / math.log(L)).clamp(min=1.0) ** t.logn_power
        if t.has("temperature") or t.has("yarn") or t.has("yarn-dim"):
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
        ReRoPE and Leaky ReRoPE, which need several score matrices. q, k, v: [B, H, T, D]
        (unrotated)."""
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
        if self.probs_hook is not None or self.dense_only or self.force_dense:
            o = self.dense(q, k, v)  # (B, H, T, D)
        else:
            o = self.fused(q, k, v)  # (B, H, T, D)
        return self.wo(o.transpose(1, 2).reshape(B, T, C))
