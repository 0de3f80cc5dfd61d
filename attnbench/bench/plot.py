"""Figures from a speed results CSV (``attnbench plot``, and ``attnbench run speed`` at its end).

For each setting in the file (direction and causal flag, and device, dtype and head dim when a
file mixes them), two figures of per-family small multiples (:mod:`attnbench.bench.panels`):
``time-<setting>`` and ``memory-<setting>``, time per call and peak memory against n; on a GPU
also ``tflops-<setting>`` (:mod:`attnbench.bench.gpu_figure`). And one
``headline`` (:mod:`attnbench.bench.headline`): at the longest n each path reached, its speed-up
and memory relative to dense SDPA.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.figure import Figure

from attnbench.bench.decode_plot import decode_figures, is_decode
from attnbench.bench.figstyle import figure_keys, file_stem, mechanism_colors, select
from attnbench.bench.gpu_figure import gpu_figure
from attnbench.bench.headline import headline_figure
from attnbench.bench.panels import METRICS, family_figure
from attnbench.bench.results import read_results
from attnbench.core.errors import AttnbenchError
from attnbench.runtime.outputs import save_figure

FORMATS = ("png", "svg")
HEADLINE_NAME = "headline"
GPU_NAME = "tflops"


@dataclass
class Figures:
    """What was drawn: the files written, and why anything expected was not."""

    paths: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def plot_results(csv: Path, out_dir: Path | None = None, fmt: str = "png") -> Figures:
    """Write every figure of ``csv`` into ``out_dir`` (default: ``figures/`` beside it)."""
    if fmt not in FORMATS:
        raise AttnbenchError(f"--format {fmt!r}: accepted: {', '.join(FORMATS)}")
    df = read_results(csv)
    _require_measurements(csv, df)
    out_dir = out_dir if out_dir is not None else csv.parent / "figures"
    _make_dir(out_dir)
    figures = Figures()
    colors = mechanism_colors(df)
    figures.paths.extend(decode_figures(df, out_dir, fmt, colors, save))
    packed = df["packing"].fillna("").astype(str) != ""
    if packed.any():
        figures.notes.append(
            "packed batches have no n axis: their speed-up over padding is in the run's summary"
        )
    df = df[~is_decode(df) & ~packed]  # the inference shapes have their own figures
    if df.empty:
        return figures
    for key in figure_keys(df):
        sub = select(df, key)
        if not (sub["status"] == "ok").any():
            figures.notes.append(f"{file_stem(df, key)}: nothing measured, no figure")
            continue
        for metric in METRICS.values():
            path = out_dir / f"{metric.name}-{file_stem(df, key)}.{fmt}"
            save(family_figure(sub, metric, colors), path)
            figures.paths.append(path)
        gpu = gpu_figure(sub)  # a CUDA run: TFLOP/s with cuDNN and flash in every panel
        if gpu is not None:
            path = out_dir / f"{GPU_NAME}-{file_stem(df, key)}.{fmt}"
            save(gpu, path)
            figures.paths.append(path)
    headline = headline_figure(df)
    if headline is None:
        figures.notes.append(
            "no headline figure: it needs softmax:efficient (dense SDPA) and an efficient or "
            "fused path measured at the same n"
        )
    else:
        path = out_dir / f"{HEADLINE_NAME}.{fmt}"
        save(headline[0], path)
        figures.paths.append(path)
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


def _make_dir(out_dir: Path) -> None:
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise AttnbenchError(f"--out {out_dir}: cannot create it ({e.strerror})") from None
