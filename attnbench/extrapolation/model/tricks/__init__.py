"""Evaluation-time length tricks for an encoder trained with plain softmax attention (Attention-O).

Each trick changes only how attention is computed at evaluation, never the weights: the trained O
model's state dict loads unchanged into a model whose mixers are :class:`TrickMixer` (same
parameter names as :class:`attnbench.layers.AttentionMixer`: ``wq, wk, wv, wo``). L is the
training length, n the length of the window being evaluated, s = max(1, n / L), d the head dim,
r = i - j the relative position of key j to query i, w the row's ReRoPE window (``rerope@48``) or
else the run's ``rerope_window`` (L/2 by default).

One module per trick, each defining ``TRICK``: its name, one line, its sources in the module's
docstring, and what it changes as hooks (:class:`~.base.Trick`). The registry (:mod:`.registry`)
finds every such module; :mod:`.row` reads a row (``rerope@48+logn``) into :class:`Tricks`;
:mod:`.mixer` is the attention that applies a row. The tricks: ``logn`` (:mod:`.logn`),
``temperature``, ``yarn``, ``yarn-dim`` (:mod:`.yarn_dim`), ``local``, ``chunk``, ``ntk``, ``pi``,
``rerope``, ``leaky``, ``hwfa``. An evaluation tool, not a training path.
"""

from __future__ import annotations

from attnbench.extrapolation.model.tricks.base import (
    LEAKY_AUTO,
    LOGN_POWER_PREFIX,
    WINDOW_MARK,
    YARN_ALPHA,
    YARN_BETA,
    YARN_BETA_FAST,
    YARN_BETA_SLOW,
    At,
    Trick,
    Tricks,
)
from attnbench.extrapolation.model.tricks.mixer import TrickMixer, trick_mixers
from attnbench.extrapolation.model.tricks.registry import REGISTRY, TRICKS
from attnbench.extrapolation.model.tricks.row import (
    ACCEPTED,
    RENAMED,
    parse_tricks,
    settings_problem,
)
from attnbench.extrapolation.model.tricks.yarn import yarn_freq_scale
from attnbench.extrapolation.model.tricks.yarn_dim import yarn_dim_freq_scale

__all__ = [
    "ACCEPTED",
    "LEAKY_AUTO",
    "LOGN_POWER_PREFIX",
    "REGISTRY",
    "RENAMED",
    "TRICKS",
    "WINDOW_MARK",
    "YARN_ALPHA",
    "YARN_BETA",
    "YARN_BETA_FAST",
    "YARN_BETA_SLOW",
    "At",
    "Trick",
    "TrickMixer",
    "Tricks",
    "parse_tricks",
    "settings_problem",
    "trick_mixers",
    "yarn_dim_freq_scale",
    "yarn_freq_scale",
]
