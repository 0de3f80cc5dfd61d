"""The accuracy figure of an extrapolation run: accuracy against evaluation length, one line per
row, the trained rows (with Su 2021's published ones) in one panel and the evaluation-time rows in
another (:func:`figure_panels`), the count floors in both; and the figure redrawn from a finished
run's ``extrapolate.csv`` (``attnbench plot``); and the figure of ``attnbench run entropy``
(:func:`entropy_figure`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from attnbench.core.errors import AttnbenchError
from attnbench.extrapolation.analysis import stats
from attnbench.extrapolation.analysis.colours import variant_colours
from attnbench.extrapolation.analysis.entropy import theory_offset
from attnbench.extrapolation.analysis.report import (
    BACKOFF_LABEL,
    EVAL_MASKS_LABEL,
    FLOOR_LABEL,
    PUBLISHED,
    summarise,
)
from attnbench.runtime.outputs import save_figure


@dataclass(frozen=True)
class Panel:
    """One panel of the figure: its title (naming only rows it draws), the model rows it draws,
    and whether Su 2021's published rows are drawn too."""

    title: str
    variants: tuple[str, ...]
    published: bool


def _drawn(summary: pd.DataFrame, kind: str) -> list[str]:
    """The variants of ``kind`` with at least one mean to draw, in the summary's order."""
    kinds = dict(zip(summary["variant"], summary["kind"], strict=False))
    has_mean = summary.dropna(subset=["mean"])["variant"]
    return [v for v in dict.fromkeys(has_mean) if kinds[v] == kind]


def figure_panels(summary: pd.DataFrame, train_len: int) -> list[Panel]:
    """Left: the trained rows (and Su 2021's published rows). Right, when any eval-time row has
    a mean: those rows, with O and E for reference where drawn. Titles are made from the rows
    drawn, so none names a row its panel does not show."""
    import textwrap

    trained = _drawn(summary, "trained")
    tricks = _drawn(summary, "eval-time")
    left = f"trained at L = {train_len}: " + (", ".join(trained) if trained else "no trained row")
    panels = [Panel(textwrap.fill(left, 72), tuple(trained), True)]
    if tricks:
        ref = [v for v in ("O", "E") if v in trained]
        right = "evaluation-time tricks: " + ", ".join(tricks)
        right += f"; for reference {', '.join(ref)}" if ref else ""
        panels.append(Panel(textwrap.fill(right, 72), tuple(ref + tricks), False))
    return panels


def floor_style(variant: str, causal: bool = False) -> dict[str, Any]:
    """``count-baseline``: the floor, a black dash-dot line (``causal``: the causal floor, a table
    of the previous bytes); ``count-eval-masks`` (the same table
    counted at the evaluation's masking rate): a thin solid black line without markers (Su 2021's
    published rows are dotted); any other count row (the old back-off rule): fainter, dashed,
    labelled as what it is."""
    if variant == FLOOR_LABEL:
        what = "the causal floor, previous bytes" if causal else "the floor, training-rate masks"
        return dict(color="black", linestyle="-.", linewidth=1.2, alpha=1.0,
                    label=f"{variant} (no model: {what})")  # fmt: skip
    if variant == EVAL_MASKS_LABEL:
        return dict(color="black", linestyle="-", linewidth=0.9, alpha=1.0,
                    label=f"{variant} (no model: the floor, evaluation-rate masks)")  # fmt: skip
    what = "no model, the old back-off rule" if variant == BACKOFF_LABEL else "no model"
    return dict(color="grey", linestyle="--", linewidth=1.0, alpha=0.5,
                label=f"{variant} ({what})")  # fmt: skip


def figure(
    summary: pd.DataFrame, lengths: Sequence[int], train_len: int, path: Path, title: str,
    loss: pd.DataFrame | None = None, loss_label: str = "loss", accuracy_label: str = "",
    published: bool = True, causal: bool = False,
) -> None:  # fmt: skip
    """Accuracy vs evaluation length, log2 x axis, one line per variant, error bars the 95 %
    t-interval of the mean over seeds (none with one seed); panels as :func:`figure_panels`
    says. The count rows (no model) in both: ``count-baseline`` as the floor line, any other
    (``count-backoff``) fainter and dashed. ``loss``: the same summary of the loss (``loss_label``
    its axis), drawn below the accuracy panels with the same rows. ``published``: Su 2021's
    rows in the trained panel (an MLM's; not beside a causal model's). ``causal``: the floor
    is the causal one (:func:`floor_style`).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = dict(zip(summary["variant"], summary["kind"], strict=False))
    panels = figure_panels(summary, train_len)
    grid = 2 if loss is not None else 1
    fig, axes = plt.subplots(grid, len(panels), figsize=(7.5 * len(panels), 5.2 * grid),
                             squeeze=False)  # fmt: skip
    colour = variant_colours(kinds, plt)  # trained rows first, none shared
    accuracy = accuracy_label or "masked-token accuracy (%)"
    for ax, panel in zip(axes[0], panels, strict=True):
        _draw(ax, summary, panel.variants, kinds, colour)
        for variant in _drawn(summary, "baseline"):
            g = summary[summary["variant"] == variant].dropna(subset=["mean"])
            g = g.sort_values("eval_len")
            ax.plot(g["eval_len"], g["mean"], **floor_style(variant, causal))
        if panel.published and published:
            for pname, values in PUBLISHED.items():
                xs = [n for n in lengths if n in values]
                ax.plot(xs, [values[n] for n in xs], linestyle=":", marker=".",
                        color="grey" if pname.endswith("O") else "black",
                        label=f"{pname} (published, other data)")  # fmt: skip
        length_axis(ax, lengths, train_len, panel.title, accuracy)
    if loss is not None:
        for ax, panel in zip(axes[1], panels, strict=True):
            drawn = [v for v in panel.variants if v in set(loss["variant"])]
            _draw(ax, loss, drawn, kinds, colour)
            length_axis(ax, lengths, train_len, f"{loss_label}: the same rows", loss_label)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    save_figure(fig, path, dpi=130)
    plt.close(fig)


def _draw(ax: Any, summary: pd.DataFrame, variants: Sequence[str], kinds: dict[str, str],
          colour: dict[str, Any]) -> None:  # fmt: skip
    """One line per variant of ``summary``: its mean against n, error bars the 95 % t-interval."""
    for variant in variants:
        g = summary[summary["variant"] == variant].dropna(subset=["mean"])
        g = g.sort_values("eval_len")
        kind = kinds.get(variant, "trained")
        pairs = zip(g["std"], g["count"], strict=True)
        half = [stats.interval_half_width(sd, int(c)) for sd, c in pairs]
        ax.errorbar(
            g["eval_len"],
            g["mean"],
            yerr=[0.0 if math.isnan(h) else h for h in half],
            label=variant if kind == "trained" else f"{variant} (eval-time)",
            color=colour[variant],
            linestyle="-" if kind == "trained" else "--",
            marker="o" if kind == "trained" else "s",
            markersize=4,
            capsize=3,
            linewidth=2.2 if variant in ("O", "E") else 1.3,
        )


#: The most legend entries a panel keeps inside its axes; more go beside it.
LEGEND_INSIDE = 8


def length_axis(ax: Any, lengths: Sequence[int], train_len: int, title: str,
                ylabel: str = "masked-token accuracy (%)") -> None:  # fmt: skip
    """An accuracy-against-length panel's axes: log2 n with the lengths as ticks, L marked."""
    ax.axvline(train_len, color="grey", linewidth=0.8, alpha=0.6)
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(lengths))
    ax.set_xticklabels([str(n) for n in lengths])
    ax.set_xlabel(f"evaluation length n (trained at L = {train_len})")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.grid(True, alpha=0.3)
    if len(ax.get_legend_handles_labels()[1]) > LEGEND_INSIDE:
        # many rows: beside the panel, where it hides no curve
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    else:
        ax.legend(fontsize=7, loc="best")


#: Columns that make a CSV an extrapolation table (``extrapolate.csv`` of ``run extrapolate``).
TABLE_COLUMNS = ("variant", "kind", "seed", "train_len", "eval_len", "accuracy", "status")


def is_table_csv(path: Path | str) -> bool:
    """Whether a CSV is the extrapolation table of ``run extrapolate``."""
    from attnbench.extrapolation.training.curves import csv_header

    path = Path(path)
    return path.is_file() and set(TABLE_COLUMNS) <= set(csv_header(path))


def _run_title(path: Path, rows: Sequence[dict[str, Any]]) -> tuple[str, bool]:
    """The accuracy figure's title of the run whose ``extrapolate.csv`` is ``path`` (its preset
    from the ``extrapolate.json`` beside it, when readable), and whether the run is causal."""
    import json

    side = path.with_suffix(".json")
    config = {}
    if side.is_file():
        try:
            config = json.loads(side.read_text(encoding="utf-8")).get("config") or {}
        except (OSError, ValueError):
            config = {}
    train_len = int(rows[0]["train_len"])
    seeds = len({r["seed"] for r in rows if r["kind"] == "trained"})
    preset = config.get("preset")
    causal = (config.get("model") or {}).get("objective") == "clm"
    title = (
        f"{accuracy_words(causal)} vs length, trained at L={train_len}"
        + (f", preset {preset}" if preset else "")
        + f", {seeds} seed{'s' if seeds != 1 else ''}"
    )
    return title, causal


def figure_from_csv(path: Path | str, out_dir: Path | None = None, fmt: str = "png") -> Path:
    """Redraw the accuracy figure of a finished run from its ``extrapolate.csv`` (and, for the
    title, the ``extrapolate.json`` beside it), into ``out_dir`` (default: beside the CSV)."""
    from attnbench.runtime.outputs import ensure_dir

    path = Path(path)
    rows = pd.read_csv(path).to_dict("records")
    if not rows:
        raise AttnbenchError(f"{path} has no rows: nothing to draw")
    title, causal = _run_title(path, rows)
    train_len = int(rows[0]["train_len"])
    lengths = sorted({int(r["eval_len"]) for r in rows})
    out = ensure_dir(out_dir if out_dir is not None else path.parent, "--out folder")
    target = out / f"accuracy_vs_length.{fmt}"
    draw(rows, lengths, train_len, target, title, causal)
    return target


def position_figure_from_csv(
    path: Path | str, out_dir: Path | None = None, fmt: str = "png"
) -> Path | None:
    """Redraw ``loss_by_position`` of a finished run from the ``positions.csv`` beside its
    ``extrapolate.csv`` into ``out_dir`` (default: beside the CSV); None when the run has no
    such file (older runs) or no length beyond L."""
    from attnbench.extrapolation.analysis import loss_report

    path = Path(path)
    positions_csv = path.parent / loss_report.CSV_NAME
    rows = pd.read_csv(path).to_dict("records")
    if not rows or not positions_csv.is_file():
        return None
    positions = pd.read_csv(positions_csv)
    if positions.empty:
        return None
    title, causal = _run_title(path, rows)
    what = title.replace(f"{accuracy_words(causal)} vs length", "Loss by position in the window")
    target = (out_dir if out_dir is not None else path.parent) / f"loss_by_position.{fmt}"
    train_len = int(rows[0]["train_len"])
    return (
        target if loss_report.position_figure(positions, train_len, causal, target, what) else None
    )


def accuracy_words(causal: bool) -> str:
    """What the accuracy is, for a title or an axis."""
    return "Next-byte accuracy (%)" if causal else "MLM accuracy (%)"


def draw(rows: Sequence[dict[str, Any]], lengths: Sequence[int], train_len: int, path: Path,
         title: str, causal: bool) -> None:  # fmt: skip
    """The figure of a run's rows: accuracy above, and the loss below when the rows have any
    (an older CSV's may not), in the objective's unit (:mod:`.loss_report`)."""
    from attnbench.extrapolation.analysis import loss_report

    models = loss_report.shown([r for r in rows if r["kind"] != "baseline"], causal)
    loss = None
    if not models.empty and models[loss_report.SHOWN].notna().any():
        loss = summarise(models, loss_report.SHOWN)
    accuracy = "next-byte accuracy (%)" if causal else "masked-token accuracy (%)"
    figure(summarise(rows), lengths, train_len, path, title, loss,
           f"loss ({loss_report.unit(causal)})", accuracy, published=not causal,
           causal=causal)  # fmt: skip


# --------------------------------------------------------------------------------------------
# The entropy figure (``attnbench run entropy``)
# --------------------------------------------------------------------------------------------


#: One colour per variant in every panel (Attention-O blue, Attention-E orange); layers of the
#: trained models are told apart by line style.
VARIANT_COLOURS = {"O": "tab:blue", "E": "tab:orange", "E-ln": "tab:green"}


LAYER_STYLES = ("-", "--", ":", "-.")


def variant_colour(variant: str) -> str:
    return VARIANT_COLOURS.get(variant, "tab:grey")


def entropy_figure(
    rows: list[dict[str, Any]], path: Path, dim: int, regime: dict[str, Any] | None = None
) -> None:
    """``run entropy``'s figure: (a) row entropy against n for random q, k, (b) inside the trained
    models when there are rows of them, (a') the scale sweep at n = max_n (``regime``: its fit)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    df = pd.DataFrame(rows)
    has_model = (df["source"] == "model").any()
    has_sweep = regime is not None
    panels = 1 + has_model + has_sweep
    fig, axes = plt.subplots(1, panels, figsize=(6 * panels if panels > 1 else 7, 4.8))
    axes = np.atleast_1d(axes)
    rnd = df[df["source"] == "random"]
    ns = sorted(rnd["n"].unique())
    ax = axes[0]
    ax.plot(ns, np.log(ns), color="grey", linestyle=":", label="log n (uniform)")
    for variant, style in (("O", "-o"), ("E", "-s")):
        g = rnd[rnd["variant"] == variant]
        ax.plot(g["n"], g["entropy"], style, color=variant_colour(variant),
                label=f"Attention-{variant}")  # fmt: skip
    ax.set_title(f"(a) random q, k of norm sqrt(d), d = {dim}")
    if has_model:
        ax = axes[1]
        mdl = df[df["source"] == "model"]
        ns_m = sorted(mdl["n"].unique())
        ax.plot(ns_m, np.log(ns_m), color="grey", linestyle=":", label="log n (uniform)")
        layers = sorted(mdl["layer"].unique())
        for (variant, layer), g in mdl.groupby(["variant", "layer"]):
            g = g.groupby("n", as_index=False)["entropy"].agg(["mean", "std"]).reset_index()
            ax.errorbar(
                g["n"],
                g["mean"],
                yerr=g["std"].fillna(0.0),
                color=variant_colour(variant),  # the same colour as in (a); layers by style
                marker="o" if variant == "O" else "s",
                linestyle=LAYER_STYLES[layers.index(layer) % len(LAYER_STYLES)],
                capsize=2,
                label=f"{variant} layer {layer}",
            )
        ax.set_title("(b) inside the trained models (mean over seeds)")
    log_n_axes = axes[: 1 + has_model]
    if has_sweep:
        sweep_panel(axes[-1], df[df["source"] == "random-scale"], dim, regime)
    for ax in log_n_axes:
        ax.set_xscale("log", base=2)
        ax.set_xlabel("n (keys per row)")
        ax.set_ylabel("mean row entropy (nats)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, path, dpi=130)
    plt.close(fig)


def sweep_panel(ax: Any, sweep: pd.DataFrame, dim: int, regime: dict[str, Any]) -> None:
    """(a'): H - log n against lambda*d at n = max_n: Su 2021's n -> infinity expression, the
    measured points (filled inside the fit, hollow outside it, beyond the expression's domain at
    this n) and the fitted line over the range used."""
    grid = np.linspace(float(sweep["lambda_d"].min()), float(sweep["lambda_d"].max()), 80)
    ax.plot(grid, [theory_offset(float(v), dim) for v in grid], color="grey", linestyle=":",
            label="Su 2021's expression (n -> infinity)")  # fmt: skip
    offset = sweep["entropy"] - sweep["log_n"]
    inside = sweep["in_fit"].astype(bool)
    ax.plot(sweep["lambda_d"][inside], offset[inside], "o", color="tab:purple",
            label="random q, k (in the fit)")  # fmt: skip
    ax.plot(sweep["lambda_d"][~inside], offset[~inside], "o", mfc="none", color="tab:purple",
            label="random q, k (outside the fit)")  # fmt: skip
    ax.axvline(regime["bound"], color="tab:red", linestyle="--", linewidth=1,
               label=f"domain bound ({regime['tolerance']} nats)")  # fmt: skip
    if regime["points"] >= 2:
        low, high = regime["lambda_d_range"]
        x = np.array([low, high])
        ax.plot(x, -regime["c"] * x + regime["b"], color="black",
                label=f"fit: c = {regime['c']:.3f}")  # fmt: skip
    ax.set_title(f"(a') scale sweep at n = {regime['n']}, d = {dim}")
    ax.set_xlabel("lambda * d")
    ax.set_ylabel("H - log n (nats)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
