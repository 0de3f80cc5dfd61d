"""Drawing a mechanism's attention pattern: in the terminal (rich, one cell per pair) and as PNG.

People pick sparse patterns by looking at them. The pattern is the boolean ``[n, n]`` matrix of
:meth:`attnbench.core.spec.Mechanism.pattern_matrix` (True where query i attends key j), built row
block by row block from the mechanism's literal rule so that a PNG of a few thousand positions
stays cheap. Library code: no typer here; matplotlib is imported only when a PNG is written.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from rich.text import Text

from attnbench.core.errors import AttnbenchError
from attnbench.core.spec import Mechanism
from attnbench.runtime.outputs import save_figure

#: Largest n drawn in the terminal (one character column per key; 2 per key when it fits).
MAX_TERMINAL_N = 128
#: Largest n written to PNG (the pattern is n x n booleans).
MAX_PNG_N = 4096
_ROWS_PER_STEP = 256


@dataclass(frozen=True)
class PatternView:
    """A pattern and what to say about it."""

    mechanism: str
    n: int
    causal: bool
    params: Mapping[str, Any]
    mask: torch.Tensor  # (n, n) bool, True = attended
    pairs: int  # exact count from the mechanism (equals mask.sum())

    @property
    def title(self) -> str:
        shown = ", ".join(f"{k}={_plain(v)}" for k, v in self.params.items())
        mode = "causal" if self.causal else "bidirectional"
        return f"{self.mechanism} ({shown or 'no parameters'}), n={self.n}, {mode}"

    @property
    def summary(self) -> str:
        total = self.n * (self.n + 1) // 2 if self.causal else self.n * self.n
        density = self.pairs / total if total else 0.0
        per_query = self.pairs / self.n if self.n else 0.0
        return (
            f"{self.pairs} attended pairs of {total} ({density:.1%}), "
            f"{per_query:.1f} keys per query on average"
        )


def _plain(value: Any) -> str:
    """A parameter value as the command line writes it (LongNet's segments as 256:1,512:2)."""
    if isinstance(value, (tuple, list)):
        return ",".join(_plain_pair(v) for v in value)
    return str(value)


def _plain_pair(value: Any) -> str:
    return ":".join(map(str, value)) if isinstance(value, (tuple, list)) else str(value)


def pattern_of(
    mech: Mechanism, n: int, causal: bool, params: Mapping[str, Any] | None = None
) -> PatternView:
    """The pattern of ``mech`` at length ``n``: validated parameters, mask and exact pair count."""
    if n < 1:
        raise AttnbenchError(f"invalid n={n}; accepted: an integer >= 1")
    problems = mech.not_supported_reasons(device=None, causal=causal)
    if problems:
        raise AttnbenchError(f"{'; '.join(problems)}; {'drop' if causal else 'add'} --causal")
    resolved = mech.resolve(params)
    if mech.visible is not None:
        mask = torch.empty(n, n, dtype=torch.bool)
        keys = torch.arange(n)[None, :]
        for r0 in range(0, n, _ROWS_PER_STEP):
            rows = torch.arange(r0, min(n, r0 + _ROWS_PER_STEP))[:, None]
            mask[r0 : r0 + rows.shape[0]] = mech.visible(rows, keys, n, causal, resolved)
    else:
        mask = mech.pattern_matrix(n, causal, resolved)
    return PatternView(mech.name, n, causal, resolved, mask, mech.pair_count(n, causal, resolved))


def to_rich(view: PatternView, width: int) -> Text:
    """The pattern as rich text: one row per query, one cell per key (two characters wide when
    the terminal is wide enough, so cells look square). Rows are numbered every 8."""
    n = view.n
    label = len(str(n - 1)) + 1
    wide = label + 2 * n <= width
    on, off = ("██", "··") if wide else ("█", "·")
    cell = len(on)
    text = Text()
    ruler = [" "] * (cell * n)
    for j in range(0, n, 8):  # key index every 8 columns
        for c, ch in enumerate(str(j)):
            if j * cell + c < len(ruler):
                ruler[j * cell + c] = ch
    text.append(" " * label + "".join(ruler) + "  key j →\n", style="dim")
    rows = view.mask.tolist()
    for i, row in enumerate(rows):
        text.append(f"{i:>{label - 1}} " if i % 8 == 0 else " " * label, style="dim")
        for seen in row:
            text.append(on if seen else off, style="bold cyan" if seen else "grey35")
        text.append("\n")
    text.append(" " * label + "query i ↓", style="dim")
    return text


def save_png(view: PatternView, path: str | Path) -> Path:
    """Write the pattern as a PNG (attended pairs dark), titled with the mechanism and its
    parameters and the pair count. Returns the path written."""
    from matplotlib.colors import ListedColormap
    from matplotlib.figure import Figure

    path = Path(path)
    if path.suffix.lower() != ".png":
        raise AttnbenchError(f"--out {str(path)!r} must end in .png")
    if not path.parent.exists():
        raise AttnbenchError(f"--out {str(path)!r}: directory {str(path.parent)!r} does not exist")
    fig = Figure(figsize=(6.4, 6.8), dpi=100 if view.n <= 512 else 200)
    ax = fig.add_subplot()
    ax.imshow(
        view.mask.numpy(),
        cmap=ListedColormap(["#f4f4f4", "#1f4e79"]),
        vmin=0,
        vmax=1,
        interpolation="nearest",
    )
    ax.set_xlabel("key j")
    ax.set_ylabel("query i")
    ax.set_title("\n".join(textwrap.wrap(view.title, 80) + [view.summary]), fontsize=9)
    fig.tight_layout()
    save_figure(fig, path)
    return path
