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

from attnbench.bench.decode_plot import decode_figures, decode_groups, is_decode
from attnbench.bench.figstyle import figure_keys, file_stem, mechanism_colors, select
from attnbench.bench.gpu_figure import gpu_figure, wants_gpu_figure
from attnbench.bench.headline import headline_figure
from attnbench.bench.panels import METRICS, family_figure
from attnbench.bench.results import files_read, read_results
from attnbench.core.errors import AttnbenchError
from attnbench.runtime.outputs import ensure_dir, refuse_to_replace, save_figure

FORMATS = ("png", "svg")
HEADLINE_NAME = "headline"
GPU_NAME = "tflops"
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
    whole = df
    decode_paths = [path for _, _, path in decode_groups(df, out_dir, fmt)]
    packed = df["packing"].fillna("").astype(str) != ""
    if packed.any():
        figures.notes.append(
            "packed batches have no n axis: their speed-up over padding is in the run's summary"
        )
    df = df[~is_decode(df) & ~packed]  # the inference shapes have their own figures
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
    gpu_paths = {  # a CUDA run: TFLOP/s with cuDNN and flash in every panel
        key: out_dir / f"{GPU_NAME}-{file_stem(df, key)}.{fmt}"
        for key in keys
        if wants_gpu_figure(select(df, key))
    }
    headline = headline_figure(df) if not df.empty else None
    headline_path = out_dir / f"{HEADLINE_NAME}.{fmt}"
    try:
        refuse_to_replace(
            [*decode_paths, *planned.values(), *gpu_paths.values(),
             *([headline_path] if headline is not None else [])],
            option="--out", folder=out_dir, inputs=files_read(csv),
            overwrite=overwrite or beside.resolve() == out_dir.resolve(),
        )  # fmt: skip
        ensure_dir(out_dir, "--out folder")
    except AttnbenchError:
        if headline is not None:
            plt.close(headline[0])
        raise
    colors = mechanism_colors(whole)
    figures.paths.extend(decode_figures(whole, out_dir, fmt, colors, save))
    if df.empty:
        return figures
    for (key, name), path in planned.items():
        save(family_figure(select(df, key), METRICS_BY_NAME[name], colors), path)
        figures.paths.append(path)
    for key, path in gpu_paths.items():
        save(gpu_figure(select(df, key)), path)
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
