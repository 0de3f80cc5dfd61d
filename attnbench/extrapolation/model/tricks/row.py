"""A row of evaluation-time tricks, as ``--eval-time`` spells it, read into a
:class:`~.base.Tricks`: the tricks (resolved once, from the registry), the windows and the
settings they read.

Tricks compose with ``+`` (``ntk+logn``, ``rerope+logn`` as in Su's own ReRoPE code,
``rerope+logn^2``, ``rerope@48+logn``), except a trick that stands alone (``chunk``); at most one
trick of a family (one that sets the rotary frequencies: ``ntk``, ``pi``, ``yarn``, ``yarn-dim``;
one that remaps the relative positions: ``rerope``, ``leaky``); a trick that already holds another
(``yarn`` holds ``temperature``, ``hwfa`` holds ``local`` and ``logn``) is not named with it.
``logn^P`` sets the power of the log n scale, ``rerope@W`` and ``leaky@W`` the row's own window.

L is the training length; windows default to L/2; the other settings (YaRN's ramps, Leaky
ReRoPE's k) default to the sources' values and are the run's ``[eval]`` settings.
"""

from __future__ import annotations

import math

from attnbench.core.errors import AttnbenchError, unknown
from attnbench.extrapolation.model.tricks.base import (
    LEAKY_AUTO,
    LOGN_POWER_PREFIX,
    RELATIVE,
    ROTARY,
    WINDOW_MARK,
    YARN_ALPHA,
    YARN_BETA,
    YARN_BETA_FAST,
    YARN_BETA_SLOW,
    Trick,
    Tricks,
)
from attnbench.extrapolation.model.tricks.registry import REGISTRY

#: Old names, and what they are called now.
RENAMED = {"yarn-temp": "temperature"}
#: Every accepted spelling, for error messages.
ACCEPTED = [*REGISTRY, "logn^P (P > 0)", "rerope@W and leaky@W (W an integer >= 1)"]


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


def _split_row(text: str) -> tuple[tuple[Trick, ...], float, int | None]:
    """``"rerope@48+logn^2"`` -> (the rerope and logn tricks, 2.0, 48): the tricks, logn's power
    and the row's own window (None: the run's)."""
    tricks, power, window = [], 1.0, None
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
        if name not in REGISTRY:
            raise unknown("evaluation-time trick", name, ACCEPTED)
        if marked:
            window = _row_window(token, REGISTRY[name], window_text)
        tricks.append(REGISTRY[name])
    if not tricks:
        raise AttnbenchError(f"empty evaluation-time row {text!r}; known: {', '.join(ACCEPTED)}")
    return tuple(tricks), power, window


def _row_window(token: str, trick: Trick, text: str) -> int:
    """The W of ``rerope@W`` / ``leaky@W``: an integer >= 1, on a trick that remaps r."""
    if trick.family != RELATIVE:
        relative = [t.name for t in REGISTRY.values() if t.family == RELATIVE]
        spelled = ", ".join(f"{name}{WINDOW_MARK}W" for name in relative)
        raise AttnbenchError(
            f"evaluation-time trick {token!r}: only {' and '.join(relative)} take a window @W; "
            f"accepted: {spelled} (W an integer >= 1), e.g. {relative[0]}{WINDOW_MARK}48"
        )
    if not (text.isascii() and text.isdigit() and int(text) >= 1):
        raise AttnbenchError(
            f"evaluation-time trick {token!r}: the window W of {trick.name}@W must be an integer "
            f">= 1; accepted: {trick.name}@W, e.g. {trick.name}@48"
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


def _check_combination(text: str, tricks: tuple[Trick, ...]) -> None:
    """Refuse a row whose tricks overlap or conflict (see the module docstring)."""
    names = [t.name for t in tricks]
    if len(set(names)) != len(names):
        raise AttnbenchError(f"evaluation-time row {text!r} names a trick twice")
    for family in (ROTARY, RELATIVE):
        named = [t.name for t in tricks if t.family == family]
        if len(named) > 1:
            group = [t.name for t in REGISTRY.values() if t.family == family]
            raise AttnbenchError(
                f"evaluation-time row {text!r} {family} twice ({', '.join(named)}); "
                f"accepted: at most one of {', '.join(group)}"
            )
    for trick in tricks:
        both = [h for h in trick.holds if h in names]
        if both:
            held_text = " and ".join("the temperature" if h == "temperature" else repr(h)
                                     for h in both)  # fmt: skip
            raise AttnbenchError(
                f"evaluation-time row {text!r}: {trick.name} already holds {held_text}; "
                f"accepted: {trick.name} without {' and '.join(both)}"
            )
    alone = [t.name for t in tricks if t.alone]
    if alone and len(tricks) > 1:
        raise AttnbenchError(f"evaluation-time row {text!r}: {alone[0]} stands alone")


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
    tricks, power, row_window = _split_row(text)
    _check_combination(text, tricks)
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
    row = Tricks(tricks, train_len, local_window, window, yarn_alpha, yarn_beta, yarn_beta_fast,
                 yarn_beta_slow, leaky_k, power, row_window is not None)  # fmt: skip
    for trick in tricks:
        if trick.check is not None:
            trick.check(row, text)
    return row
