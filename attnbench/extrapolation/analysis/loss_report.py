"""Loss against length, beside accuracy: table.md's loss part, ``positions.csv`` (the
per-position view) and its figure, ``loss_by_position.png``.

The loss is the cross-entropy of the scored bytes: for the masked-language model (``mlm``) of the
masked bytes, in nats; for the causal language model (``clm``) of every next byte, in bits per
byte (cross-entropy / ln 2, the unit language models report; 2^bits is the perplexity per byte).
The per-position view splits each row's scored bytes by their position in the window (bins
[0, L), [L, 2L), [2L, 4L), ...; :mod:`attnbench.extrapolation.evaluation.targets` says what a
position is for each objective): does a row fail only where the positions are new?
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from attnbench.extrapolation.analysis import report, stats
from attnbench.extrapolation.analysis.colours import variant_colours
from attnbench.runtime.outputs import atomic_open, save_figure

CSV_NAME, FIGURE_NAME = "positions.csv", "loss_by_position.png"
#: The columns the tables read: the loss, and the loss of the positions beyond L, in the unit of
#: the objective (added to a copy of the rows by :func:`shown`).
SHOWN, SHOWN_BEYOND = "loss_shown", "loss_beyond_L_shown"


def unit(causal: bool) -> str:
    return "bits per byte" if causal else "nats per masked byte"


def shown(rows: Sequence[dict[str, Any]] | pd.DataFrame, causal: bool) -> pd.DataFrame:
    """The rows with :data:`SHOWN` and :data:`SHOWN_BEYOND`: the loss (nats) and the loss of the
    positions beyond L in the objective's unit (bits for ``clm``)."""
    df = pd.DataFrame(rows).copy()
    factor = 1 / math.log(2) if causal else 1.0
    for column, out in (("loss", SHOWN), ("loss_beyond_L", SHOWN_BEYOND)):
        values = df[column] if column in df else pd.Series(float("nan"), index=df.index)
        df[out] = pd.to_numeric(values, errors="coerce") * factor
    return df


def _cell(test: stats.Paired) -> str:
    """A loss difference: 3 decimals, bold where p < 0.05, with the sign count."""
    body = f"**{test.text(3)}**" if test.significant else test.text(3)
    return f"{body}, {test.signs()}" if test.count > 1 else body


def difference_table(df: pd.DataFrame, lengths: Sequence[int], metric: str,
                     base: str = "O") -> list[str]:  # fmt: skip
    """Markdown lines: every model row's ``metric`` − ``base``'s, paired by seed, per length;
    [] when there is no other model row."""
    diff = report.paired_difference(df.to_dict("records"), base, metric)
    if diff.empty:
        return []
    lines = [f"| variant − {base} | " + " | ".join(f"n={n}" for n in lengths) + " |",
             "|---|" + "---:|" * len(lengths)]  # fmt: skip
    for variant, group in diff.groupby("variant", sort=False):
        by_n = {int(r.eval_len): r for r in group.itertuples()}
        cells = [_cell(_paired(by_n[n])) if n in by_n else "-" for n in lengths]
        lines.append(f"| {variant} | " + " | ".join(cells) + " |")
    return lines


def _paired(r: Any) -> stats.Paired:
    return stats.Paired(r.mean, r.low, r.high, r.p, int(r.count), int(r.positive),
                        int(r.negative))  # fmt: skip


def loss_markdown(
    rows: Sequence[dict[str, Any]], lengths: Sequence[int], train_len: int, causal: bool
) -> list[str]:
    """table.md's loss part: the loss of every model row against n (mean ± std over seeds), its
    paired difference to O, then the loss of the positions beyond L alone, for n > L."""
    df = shown([r for r in rows if r.get("kind") != "baseline"], causal)
    if df.empty:
        return []
    what = "cross-entropy of the next byte" if causal else "cross-entropy of the masked bytes"
    lines = [
        f"Loss ({unit(causal)}: {what}), mean ± std over seeds; lower is better (count rows "
        "have no probabilities to score):",
        "",
        report.markdown_table(report.summarise(df, SHOWN), lengths, published=False),
        "",
    ]
    if diff := difference_table(df, lengths, SHOWN):
        lines += [f"Loss difference to O ({unit(causal)}), paired by seed: mean [95 % "
                  "t-interval] p, sign count; bold where p < 0.05 (descriptive):", "",
                  *diff, ""]  # fmt: skip
    longer = [n for n in lengths if n > train_len]
    beyond = df[df["eval_len"].isin(longer)]
    if longer and beyond[SHOWN_BEYOND].notna().any():
        lines += [
            f"Loss of the positions at or beyond L = {train_len} alone ({unit(causal)}; the "
            f"per-position view, every bin in `{CSV_NAME}`): does a row fail only where the "
            "positions are new?",
            "",
            report.markdown_table(
                report.summarise(beyond, SHOWN_BEYOND), longer, published=False
            ),  # fmt: skip
            "",
        ]
    return lines


def write_positions(rows: Sequence[dict[str, Any]], key: str, path: Path) -> None:
    """Per row and position bin: the scored bytes, how many right, accuracy and loss (nats)."""
    with atomic_open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["variant", "kind", "seed", "eval_len", "bin_start", "bin_end", "scored",
                         "correct", "accuracy", "loss"])  # fmt: skip
        for row in rows:
            for start, end, scored, correct, loss_sum in row.get(key) or ():
                accuracy = round(100.0 * correct / scored, 6) if scored else ""
                loss = round(loss_sum / scored, 6) if scored else ""
                writer.writerow([row["variant"], row["kind"], row["seed"], row["eval_len"],
                                 start, end, scored, correct, accuracy, loss])  # fmt: skip


def position_figure(positions: pd.DataFrame, train_len: int, causal: bool, path: Path,
                    title: str) -> bool:  # fmt: skip
    """Loss against position in the window at the longest length: one line per row (mean over
    seeds of each bin's loss), the bins at their end on a log2 axis, L marked. Returns False
    (nothing drawn) when the longest length is not beyond L."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    longest = int(positions["eval_len"].max())
    if longest <= train_len:
        return False
    df = positions[(positions["eval_len"] == longest) & (positions["scored"] > 0)].copy()
    factor = 1 / math.log(2) if causal else 1.0
    df["shown"] = pd.to_numeric(df["loss"]) * factor
    colour = variant_colours(dict(zip(df["variant"], df["kind"], strict=True)), plt)
    fig, ax = plt.subplots(figsize=(7.5, 5.0))
    for variant, g in df.groupby("variant", sort=False):
        mean = g.groupby("bin_end", sort=True)["shown"].mean()
        trained = g["kind"].iloc[0] == "trained"
        ax.plot(mean.index, mean.values, marker="o" if trained else "s", color=colour[variant],
                linestyle="-" if trained else "--", linewidth=2.0 if trained else 1.2,
                label=variant if trained else f"{variant} (eval-time)")  # fmt: skip
    ax.axvline(train_len, color="grey", linewidth=0.8, alpha=0.6)
    ax.set_xscale("log", base=2)
    ends = sorted(df["bin_end"].unique())
    ax.set_xticks(ends)
    ax.set_xticklabels([str(int(e)) for e in ends])
    ax.set_xlabel(f"end of the position bin in windows of n = {longest} (L = {train_len} marked)")
    ax.set_ylabel(f"loss ({unit(causal)})")
    ax.set_title(title, fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    fig.tight_layout()
    save_figure(fig, path, dpi=130)
    plt.close(fig)
    return True
