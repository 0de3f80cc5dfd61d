"""Figures from a speed results CSV (``attnbench plot``, and ``attnbench run speed`` at its end).

For each setting in the file (direction and causal flag, and device, dtype and head dim when a
file mixes them), two figures of per-family small multiples (:mod:`attnbench.bench.panels`):
``time-<setting>`` and ``memory-<setting>``, time per call and peak memory against n. And one
``headline`` (:mod:`attnbench.bench.headline`): at the longest n each path reached, its speed-up
and memory relative to dense SDPA.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.figure import Figure

from attnbench.bench.figstyle import figure_keys, file_stem, mechanism_colors, select
from attnbench.bench.headline import headline_figure
from attnbench.bench.panels import METRICS, family_figure
from attnbench.bench.results import files_read, read_results
from attnbench.core.errors import AttnbenchError
from attnbench.runtime.outputs import ensure_dir, refuse_to_replace, save_figure

FORMATS = ("png", "svg")
HEADLINE_NAME = "headline"
METRICS_BY_NAME = {metric.name: metric for metric in METRICS.values()}


@dataclass
class Figures:
    """What was drawn: the files written, and why anything expected was not."""

    paths: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def plot_results(
    csv: Path, out_dir: Path | None = None, fmt: str = "png", overwrite: bool = False
) -> Figures:
    """Write every figure of ``csv`` into ``out_dir`` (default: ``figures/`` beside it). Figures
    already in ``figures/`` beside the CSV are its own and are drawn again; those in another
    folder are replaced only with ``overwrite`` (they may be another run's)."""
    if fmt not in FORMATS:
        raise AttnbenchError(f"--format {fmt!r}: accepted: {', '.join(FORMATS)}")
    df = read_results(csv)
    _require_measurements(csv, df)
    beside = csv.parent / "figures"
    out_dir = out_dir if out_dir is not None else beside
    figures = Figures()
    keys = []
    for key in figure_keys(df):
        if (select(df, key)["status"] == "ok").any():
            keys.append(key)
        else:
            figures.notes.append(f"{file_stem(df, key)}: nothing measured, no figure")
    planned = {
        (key, metric.name): out_dir / f"{metric.name}-{file_stem(df, key)}.{fmt}"
        for key in keys
        for metric in METRICS.values()
    }
    headline = headline_figure(df)
    headline_path = out_dir / f"{HEADLINE_NAME}.{fmt}"
    try:
        refuse_to_replace(
            [*planned.values(), *([headline_path] if headline is not None else [])],
            option="--out", folder=out_dir, inputs=files_read(csv),
            overwrite=overwrite or beside.resolve() == out_dir.resolve(),
        )  # fmt: skip
        ensure_dir(out_dir, "--out folder")
    except AttnbenchError:
        if headline is not None:
            plt.close(headline[0])
        raise
    colors = mechanism_colors(df)
    for (key, name), path in planned.items():
        save(family_figure(select(df, key), METRICS_BY_NAME[name], colors), path)
        figures.paths.append(path)
    if headline is None:
        figures.notes.append(
            "no headline figure: it needs softmax:efficient (dense SDPA) and an efficient or "
            "fused path measured at the same n"
        )
    else:
        save(headline[0], headline_path)
        figures.paths.append(headline_path)
    return figures


def save(fig: Figure, path: Path) -> None:
    """Whole or not at all: a full disk leaves no truncated image, and names the file."""
    try:
        save_figure(fig, path, dpi=100, bbox_inches="tight")
    finally:
        plt.close(fig)


def _require_measurements(csv: Path, df: pd.DataFrame) -> None:
    if df.empty:
        raise AttnbenchError(f"{csv}: the results CSV has no rows; plot needs measured rows")
    if not (df["status"] == "ok").any():
        counts = ", ".join(f"{n} {s}" for s, n in df["status"].value_counts().items())
        raise AttnbenchError(
            f"{csv}: nothing was measured ({counts}); plot needs rows with status ok"
        )
