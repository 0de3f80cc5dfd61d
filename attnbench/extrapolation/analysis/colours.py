"""One colour per variant of an extrapolation run, shared by its figures (the accuracy figure of
:mod:`.figures` and the loss by position of :mod:`.loss_report`), however many rows the run has."""

from __future__ import annotations

from typing import Any


def variant_colours(kinds: dict[str, str], plt: Any) -> dict[str, Any]:
    """One distinct colour per variant, for any number of them: the trained rows first (so O,
    E and the trained encodings take tab20's strong shades, in table order), then the
    evaluation-time rows; tab20's strong shades, then its light ones, then tab20b's."""
    tab20, tab20b = plt.get_cmap("tab20").colors, plt.get_cmap("tab20b").colors
    palette = [*tab20[0::2], *tab20[1::2], *tab20b]
    order = sorted(kinds, key=lambda v: kinds[v] != "trained")  # stable: table order within
    return {v: palette[i % len(palette)] for i, v in enumerate(order)}
