"""What an evaluation-time trick is to the code: a :class:`Trick` record, one per module of this
package, and a row of them with its settings (:class:`Tricks`). A trick's hooks say what the
trick changes in the attention of a trained O model. The mixer (:mod:`.mixer`) composes the
hooks of a row's tricks in a fixed order: the rotary embedding (:attr:`Trick.rotary`), the
scores' relative positions (:attr:`Trick.remap`), then the row factors (the window
:attr:`Trick.windowed`, the log n scale :attr:`Trick.log_scaled`, YaRN's temperature
:attr:`Trick.temperature`); the evaluator cuts windows into chunks (:attr:`Trick.chunked`). A
trick sets only the hooks it needs; every hook is a module-level function, so that a row of
tricks crosses to a worker process by pickling.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

if TYPE_CHECKING:
    from attnbench.core.building_blocks import Rotary

#: Tricks of a family change the same thing, so a row holds at most one of each: those that set
#: the rotary frequencies, those that remap the relative positions.
ROTARY, RELATIVE = "sets the rotary frequencies", "remaps the relative positions"
#: ``rerope@W``, ``leaky@W``: the row's own window w = W (a relative trick only).
WINDOW_MARK = "@"
#: ``logn^P``: the log n scale to the power P.
LOGN_POWER_PREFIX = "logn^"
# The defaults of the settings the tricks read (the run's [eval] may change them).
#: YaRN's ramp in the paper's form: pairs making fewer than alpha turns over the training length
#: are interpolated fully, more than beta not at all (Peng et al. 2023's values for LLaMA).
YARN_ALPHA, YARN_BETA = 1.0, 32.0
#: YaRN's ramp as its code computes it: the pairs making beta_fast and beta_slow turns over L
#: bound the ramp over the pair index (jquesnelle/yarn's and Transformers' defaults).
YARN_BETA_FAST, YARN_BETA_SLOW = 32.0, 1.0
#: Leaky ReRoPE's k: 0 chooses it per n.
LEAKY_AUTO = 0.0


@dataclass(frozen=True)
class Tricks:
    """A row of evaluation-time tricks (the records, in the row's order), their windows and
    settings."""

    tricks: tuple[Trick, ...]
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
    def names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.tricks)

    @property
    def label(self) -> str:
        return "+".join(t.spelled(self) if t.spelled else t.name for t in self.tricks)

    @property
    def chunk(self) -> bool:
        """Whether the windows are evaluated as independent L-token chunks."""
        return any(t.chunked for t in self.tricks)

    def has(self, name: str) -> bool:
        return name in self.names

    def leaky_factor(self, n: int) -> float:
        """Leaky ReRoPE's k at length n: ``leaky_k``, or the least k >= 1 that maps the farthest
        key (abs(r) = n - 1) to L - 1 when it is 0 (:mod:`.leaky`)."""
        if self.leaky_k != LEAKY_AUTO:
            return self.leaky_k
        w, L = self.rerope_window, self.train_len
        return max(1.0, (n - 1 - w) / (L - 1 - w))

    def parameters(self, name: str) -> str:
        """The settings the row's trick ``name`` reads, as ``key=value`` (empty when none)."""
        trick = next((t for t in self.tricks if t.name == name), None)
        return trick.settings(self) if trick is not None and trick.settings else ""

    def describe(self) -> str:
        """Each trick's description with its settings (what the sidecar and the CSV record)."""
        parts = []
        for t in self.tricks:
            text = t.describe(self) if t.describe else t.summary
            params = t.settings(self) if t.settings else ""
            parts.append(f"{text} [{params}]" if params else text)
        return "; ".join(parts)


@dataclass(frozen=True)
class At:
    """Where a hook is applied: the row (its windows and settings), the length n of the windows
    evaluated, the head dim d, the model's rotary base, and the mixer's layer (its index and the
    layer count; None where the mixer was built without them)."""

    row: Tricks
    n: int
    head_dim: int
    rope_base: float
    layer: int | None = None
    layers: int | None = None

    @property
    def s(self) -> float:
        """The extension s = max(1, n / L)."""
        return max(1.0, self.n / self.row.train_len)

    @property
    def last_layer(self) -> bool:
        return self.layers is not None and self.layer == self.layers - 1


@dataclass(frozen=True)
class Trick:
    """One evaluation-time trick: its name and one line (the sidecar's and the CSV's note), the
    rules of a row (its family, what it already holds, whether it stands alone), and its hooks
    (None: the trick changes nothing there)."""

    name: str
    summary: str
    family: str = ""  # ROTARY or RELATIVE: at most one trick of a family in a row
    holds: tuple[str, ...] = ()  # tricks it already holds: naming both is refused
    alone: bool = False  # stands alone in its row
    #: The rotary embedding at ``at.n``: keyword arguments of :class:`Rotary` it changes
    #: (``base``, ``position_scale``, ``freq_scale``).
    rotary: Callable[[At], dict[str, Any]] | None = None
    #: Raw scores [B, H, T, T] with the relative positions remapped: ``(at, q, k, rotary,
    #: scores) -> scores``, q and k unrotated. Needs several score matrices: dense only.
    remap: Callable[[At, Tensor, Tensor, Rotary, Tensor], Tensor] | None = None
    #: Whether queries see only keys within +-local_window in this layer.
    windowed: Callable[[At], bool] | None = None
    #: Whether this layer's scores are scaled by max(1, log n_i / log L)^p (n_i the keys query
    #: i sees, p the row's ``logn^P``).
    log_scaled: Callable[[At], bool] | None = None
    #: Scores times YaRN's temperature (0.1 ln s + 1)^2.
    temperature: bool = False
    #: Windows evaluated as independent L-token chunks (done by the evaluator).
    chunked: bool = False
    #: Needs each mixer's layer index and the layer count.
    needs_layers: bool = False
    #: The trick as a row's label spells it (``logn^2``, ``rerope@48``); None: its name.
    spelled: Callable[[Tricks], str] | None = None
    #: Its one line with the row's settings filled in; None: :attr:`summary`.
    describe: Callable[[Tricks], str] | None = None
    #: The settings it reads, as ``key=value`` (the sidecar); None: none.
    settings: Callable[[Tricks], str] | None = None
    #: Refuses a row it cannot evaluate (``(row, text)``, raising AttnbenchError); None: any.
    check: Callable[[Tricks, str], None] | None = None

    @property
    def dense_only(self) -> bool:
        """Whether the trick needs the scores spelled out (no SDPA path)."""
        return self.remap is not None


def yarn_temperature(s: float) -> float:
    """YaRN's logit factor 1/t = (0.1 ln s + 1)^2 for an extension s = n / L (1 for s <= 1): the
    ``temperature`` of a trick (Peng et al. 2023, "YaRN: Efficient Context Window Extension of
    Large Language Models", https://arxiv.org/abs/2309.00071)."""
    return (0.1 * math.log(max(1.0, s)) + 1.0) ** 2


def everywhere(at: At) -> bool:
    """A hook's answer for a trick that acts in every layer."""
    return True


def beyond_window(q: Tensor, window: int, s: Tensor, s_pos: Tensor, s_neg: Tensor) -> Tensor:
    """``s`` where abs(r) < w, ``s_pos`` where r >= w, ``s_neg`` where r <= -w (r = i - j, the
    relative position of key j to query i): [B, H, T, T]."""
    T = q.shape[-2]
    pos = torch.arange(T, device=q.device)
    rel = pos[:, None] - pos[None, :]  # (T, T)
    return torch.where(rel >= window, s_pos, torch.where(rel <= -window, s_neg, s))


def window_text(row: Tricks, name: str, text: str) -> str:
    """``name``'s description with the row's ReRoPE window filled in: ``+-rerope_window (32)``
    when the run sets it, ``+-48 (the row's @48)`` when the row does."""
    w, generic = row.rerope_window, f"(L/2; {name}{WINDOW_MARK}W: W)"
    if row.window_from_row:
        return text.replace(f"rerope_window {generic}", f"{w} (the row's {WINDOW_MARK}{w})")
    return text.replace(generic, f"({w})")


def window_setting(row: Tricks) -> str:
    """``rerope_window=W``, saying when W is the row's own ``@W``."""
    window = f"rerope_window={row.rerope_window}"
    if row.window_from_row:
        window += f" (the row's {WINDOW_MARK}{row.rerope_window})"
    return window


def window_spelled(name: str, row: Tricks) -> str:
    """``rerope@48`` when the row sets its own window, else the name."""
    return f"{name}{WINDOW_MARK}{row.rerope_window}" if row.window_from_row else name
