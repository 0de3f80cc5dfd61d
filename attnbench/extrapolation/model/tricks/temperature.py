"""``temperature``: scores times (0.1 ln s + 1)^2, s = max(1, n / L): YaRN's attention temperature
alone (Peng et al. 2023), without its interpolation: not YaRN (``yarn`` is YaRN in full).

Peng et al. 2023: Bowen Peng, Jeffrey Quesnelle, Honglu Fan, Enrico Shippole, "YaRN: Efficient
Context Window Extension of Large Language Models", 2023, https://arxiv.org/abs/2309.00071.
"""

from __future__ import annotations

from attnbench.extrapolation.model.tricks.base import Trick

TRICK = Trick(
    "temperature",
    "scores x (0.1 ln(n/L) + 1)^2 (YaRN's temperature alone, not YaRN)",
    temperature=True,
)
