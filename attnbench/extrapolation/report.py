"""The extrapolation suite's outputs: tidy CSV, summary table (mean +- std over seeds), figure.

The published rows of Su 2021 (RoFormer small, trained at 64, its own data) are printed
beside ours, labelled "Su 2021"; their numbers are not comparable in level (other data,
tokenizer and model), only in shape.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from attnbench.core.errors import AttnbenchError
from attnbench.extrapolation import stats
from attnbench.runtime.outputs import atomic_open, save_figure

#: Su 2021's table: MLM accuracy (%) of RoFormer small trained at n = 64.
PUBLISHED: dict[str, dict[int, float]] = {
    "Su 2021: Attention-O": {64: 43.27, 128: 36.53, 256: 23.02, 512: 15.12, 1024: 11.54},
    "Su 2021: Attention-E": {64: 43.11, 128: 41.17, 256: 34.04, 512: 20.15, 1024: 13.58},
}

BASE_COLUMNS = [
    "variant",
    "kind",
    "applied_to",
    "mechanism",
    "path",
    "params",
    "note",
    "seed",
    "train_len",
    "eval_len",
    "accuracy",
    "loss",
    "masked_tokens",
    "windows",
    "eval_tokens",
]
TAIL_COLUMNS = ["model_params", "train_time_s", "train_steps", "eval_time_s", "status", "reason"]


def columns(layers: int) -> list[str]:
    return BASE_COLUMNS + [f"entropy_l{i}" for i in range(layers)] + TAIL_COLUMNS


def write_csv(rows: Sequence[dict[str, Any]], path: Path) -> None:
    """One row per (variant, seed, length); entropy columns for the deepest model's blocks."""
    layers = max(
        (int(k[len("entropy_l") :]) + 1 for r in rows for k in r if k.startswith("entropy_l")),
        default=0,
    )
    cols = columns(layers)
    with atomic_open(path, "w", newline="", encoding="utf-8") as f:  # whole or not at all
        writer = csv.DictWriter(f, fieldnames=cols, extrasaction="raise")
        writer.writeheader()
        for row in rows:
            writer.writerow({c: _cell(row.get(c)) for c in cols})


def _cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, float):
        return "" if math.isnan(value) else round(value, 6)
    return value


def summarise(rows: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """Mean, std (over seeds, ddof 1) and seed count of accuracy per (variant, kind, eval_len),
    in the order the variants first appear; failed cells count in ``failed``."""
    df = pd.DataFrame(rows)
    order = list(dict.fromkeys(df["variant"]))
    ok = df[df["status"] == "ok"]
    agg = (
        ok.groupby(["variant", "kind", "eval_len"], sort=False)["accuracy"]
        .agg(["mean", "std", "count"])
        .reset_index()
    )
    failed = (
        df[df["status"] != "ok"].groupby(["variant", "eval_len"]).size().rename("failed")
    ).reset_index()
    agg = agg.merge(failed, on=["variant", "eval_len"], how="outer")
    agg["failed"] = agg["failed"].fillna(0).astype(int)
    agg["kind"] = agg["variant"].map(dict(zip(df["variant"], df["kind"], strict=False)))
    agg["rank"] = agg["variant"].map({v: i for i, v in enumerate(order)})
    return agg.sort_values(["rank", "eval_len"]).drop(columns="rank").reset_index(drop=True)


def paired_difference(rows: Sequence[dict[str, Any]], base: str = "O") -> pd.DataFrame:
    """Per (variant, length): (variant - base) accuracy paired by seed, as :func:`stats.paired`
    gives it: ``mean``, the 95 % t-interval ``low``..``high``, ``p`` (paired t-test, two-sided)
    and ``count`` (seeds); ``std`` too. Baseline rows (no seed) are left out."""
    df = pd.DataFrame(rows)
    df = df[(df["status"] == "ok") & (df["kind"] != "baseline")]
    ref = df[df["variant"] == base][["seed", "eval_len", "accuracy"]].rename(
        columns={"accuracy": "ref"}
    )
    joined = df.merge(ref, on=["seed", "eval_len"])
    joined["diff"] = joined["accuracy"] - joined["ref"]
    out = []
    for (variant, n), g in joined.groupby(["variant", "eval_len"], sort=False):
        test = stats.paired(g["diff"].tolist())
        std = float(g["diff"].std()) if len(g) > 1 else float("nan")
        out.append(
            dict(variant=variant, eval_len=n, mean=test.mean, std=std, low=test.low,
                 high=test.high, p=test.p, count=test.count)
        )  # fmt: skip
    frame = pd.DataFrame(out, columns=["variant", "eval_len", "mean", "std", "low", "high", "p",
                                       "count"])  # fmt: skip
    order = {v: i for i, v in enumerate(dict.fromkeys(df["variant"]))}
    frame["rank"] = frame["variant"].map(order)
    return frame.sort_values(["rank", "eval_len"]).drop(columns="rank").reset_index(drop=True)


def _paired(r: Any) -> stats.Paired:
    return stats.Paired(r.mean, r.low, r.high, r.p, int(r.count))


def _fmt(mean: float, std: float, count: int) -> str:
    if count == 0 or math.isnan(mean):
        return "-"
    if count == 1 or math.isnan(std):
        return f"{mean:.2f}"
    return f"{mean:.2f} ± {std:.2f}"


def table_cells(summary: pd.DataFrame, lengths: Sequence[int]) -> list[tuple[str, str, list[str]]]:
    """(variant, kind, [cell per length]) rows of the summary, then the published rows."""
    out = []
    for variant, group in summary.groupby("variant", sort=False):
        by_n = {int(r.eval_len): r for r in group.itertuples()}
        cells = []
        for n in lengths:
            r = by_n.get(n)
            if r is None:
                cells.append("-")
            elif r.count == 0 or pd.isna(r.mean):
                cells.append(f"failed ({int(r.failed)})")
            else:
                cells.append(_fmt(r.mean, r.std, int(r.count)))
        out.append((variant, str(group["kind"].iloc[0]), cells))
    for name, values in PUBLISHED.items():
        out.append((name, "published", [_pub(values, n) for n in lengths]))
    return out


def _pub(values: dict[int, float], n: int) -> str:
    return f"{values[n]:.2f}" if n in values else "-"


def markdown_table(summary: pd.DataFrame, lengths: Sequence[int]) -> str:
    head = "| variant | kind | " + " | ".join(f"n={n}" for n in lengths) + " |"
    sep = "|---|---|" + "---:|" * len(lengths)
    lines = [head, sep]
    for variant, kind, cells in table_cells(summary, lengths):
        lines.append(f"| {variant} | {kind} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def markdown_difference(diff: pd.DataFrame, lengths: Sequence[int], base: str = "O") -> str:
    """variant − base per length: mean [95 % interval] p over seeds; significant (p < 0.05)
    cells in bold."""
    head = f"| variant − {base} | " + " | ".join(f"n={n}" for n in lengths) + " |"
    lines = [head, "|---|" + "---:|" * len(lengths)]
    for variant, group in diff.groupby("variant", sort=False):
        if variant == base:
            continue
        by_n = {int(r.eval_len): r for r in group.itertuples()}
        cells = []
        for n in lengths:
            r = by_n.get(n)
            if r is None:
                cells.append("-")
                continue
            test = _paired(r)
            cells.append(f"**{test.text()}**" if test.significant else test.text())
        lines.append(f"| {variant} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


#: The issue's reading of Su 2021's shape, on the mean over seeds of E - O (points):
#: (length, test, threshold, words).
SHAPE_CHECKS = (
    (64, "abs<=", 1.5, "|E − O| ≤ 1.5 at n = 64 (equal at the training length)"),
    (128, ">=", -0.5, "E − O ≥ −0.5 at n = 128"),
    (256, ">=", 3.0, "E − O ≥ 3 at n = 256"),
    (512, ">=", 3.0, "E − O ≥ 3 at n = 512"),
    (1024, ">=", 0.0, "E ≥ O at n = 1024"),
)


def shape_checks(diff: pd.DataFrame, variant: str = "E") -> list[str]:
    """Markdown bullet lines: does ``variant`` − O meet Su 2021's shape at each length, on the
    mean, and is the difference significant (paired t-test over seeds, p < 0.05)?"""
    rows = {int(r.eval_len): r for r in diff[diff["variant"] == variant].itertuples()}
    lines = []
    for n, test, threshold, words in SHAPE_CHECKS:
        if n not in rows:
            continue
        r = _paired(rows[n])
        ok = abs(r.mean) <= threshold if test == "abs<=" else r.mean >= threshold
        if test == "abs<=":
            verdict = "no significant difference" if not r.significant else "significant"
        elif r.count < 2:
            verdict = "one seed: no test"
        elif r.significant and r.mean > 0:
            verdict = f"{variant} ahead, significant at 0.05"
        else:
            verdict = "not significant at 0.05"
        lines.append(f"- {words}: {'yes' if ok else 'no'} on the mean ({r.text(2)}; {verdict})")
    return lines


def training_times(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Markdown bullet lines: training wall time per trained variant (mean over seeds)."""
    df = pd.DataFrame(rows)
    df = df[df["kind"] == "trained"].drop_duplicates(["variant", "seed"])
    out = []
    for variant, g in df.groupby("variant", sort=False):
        minutes = g["train_time_s"].astype(float) / 60
        out.append(
            f"- {variant}: {minutes.mean():.1f} min a seed ({len(g)} seed"
            f"{'s' if len(g) > 1 else ''}, {int(g['train_steps'].iloc[0])} steps)"
        )
    return out


def _signed(mean: float, std: float, count: int) -> str:
    if count > 1 and not math.isnan(std):
        return f"{mean:+.2f} ± {std:.2f}"
    return f"{mean:+.2f}"


def figure(
    summary: pd.DataFrame, lengths: Sequence[int], train_len: int, path: Path, title: str
) -> None:
    """Accuracy vs evaluation length, log2 x axis, one line per variant, error bars the 95 %
    t-interval of the mean over seeds (none with one seed).

    Left: the trained variants and Su 2021's published rows (dotted; other data, compare shapes).
    Right (when there are eval-time rows): the tricks applied to the trained O model, with O and E
    for reference. The count baseline (no model), dash-dotted, in both.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = dict(zip(summary["variant"], summary["kind"], strict=False))
    trained = [v for v in dict.fromkeys(summary["variant"]) if kinds[v] == "trained"]
    tricks = [v for v in dict.fromkeys(summary["variant"]) if kinds[v] == "eval-time"]
    floors = [v for v in dict.fromkeys(summary["variant"]) if kinds[v] == "baseline"]
    panels = [(f"trained at L = {train_len}", trained, True)]
    if tricks:
        ref = [v for v in ("O", "E") if v in trained]
        panels.append(("evaluation-time tricks on the trained O", ref + tricks, False))
    fig, axes = plt.subplots(1, len(panels), figsize=(7.5 * len(panels), 5.2), squeeze=False)
    colours = plt.get_cmap("tab20").colors
    colour = {v: colours[(2 * i) % 20 + (2 * i // 20) % 2] for i, v in enumerate(kinds)}
    for ax, (name, variants, published) in zip(axes[0], panels, strict=True):
        for variant in variants:
            g = summary[summary["variant"] == variant].dropna(subset=["mean"])
            g = g.sort_values("eval_len")
            if g.empty:
                continue
            kind = kinds[variant]
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
        for variant in floors:
            g = summary[summary["variant"] == variant].dropna(subset=["mean"])
            g = g.sort_values("eval_len")
            ax.plot(g["eval_len"], g["mean"], color="black", linestyle="-.", linewidth=1.0,
                    label=f"{variant} (no model)")  # fmt: skip
        if published:
            for pname, values in PUBLISHED.items():
                xs = [n for n in lengths if n in values]
                ax.plot(
                    xs,
                    [values[n] for n in xs],
                    linestyle=":",
                    color="grey" if pname.endswith("O") else "black",
                    marker=".",
                    label=f"{pname} (published, other data)",
                )
        ax.axvline(train_len, color="grey", linewidth=0.8, alpha=0.6)
        ax.set_xscale("log", base=2)
        ax.set_xticks(list(lengths))
        ax.set_xticklabels([str(n) for n in lengths])
        ax.set_xlabel(f"evaluation length n (trained at L = {train_len})")
        ax.set_ylabel("masked-token accuracy (%)")
        ax.set_title(name, fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    save_figure(fig, path, dpi=130)
    plt.close(fig)


#: Columns that make a CSV an extrapolation table (``extrapolate.csv`` of ``run extrapolate``).
TABLE_COLUMNS = ("variant", "kind", "seed", "train_len", "eval_len", "accuracy", "status")


def is_table_csv(path: Path | str) -> bool:
    """Whether a CSV is the extrapolation table of ``run extrapolate``."""
    from attnbench.extrapolation.curves import csv_header

    path = Path(path)
    return path.is_file() and set(TABLE_COLUMNS) <= set(csv_header(path))


def figure_from_csv(path: Path | str, out_dir: Path | None = None, fmt: str = "png") -> Path:
    """Redraw the accuracy figure of a finished run from its ``extrapolate.csv`` (and, for the
    title, the ``extrapolate.json`` beside it), into ``out_dir`` (default: beside the CSV)."""
    import json

    from attnbench.runtime.outputs import ensure_dir

    path = Path(path)
    rows = pd.read_csv(path).to_dict("records")
    if not rows:
        raise AttnbenchError(f"{path} has no rows: nothing to draw")
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
    title = (
        f"MLM accuracy (%) vs length, trained at L={train_len}"
        + (f", preset {preset}" if preset else "")
        + f", {seeds} seed{'s' if seeds != 1 else ''}"
    )
    lengths = sorted({int(r["eval_len"]) for r in rows})
    out = ensure_dir(out_dir if out_dir is not None else path.parent, "--out folder")
    target = out / f"accuracy_vs_length.{fmt}"
    figure(summarise(rows), lengths, train_len, target, title)
    return target


# --------------------------------------------------------------------------------------------
# Within one seed: a bootstrap over the evaluation span's pieces
# --------------------------------------------------------------------------------------------

#: Bootstrap draws (resamples of the pieces) per (variant, seed, length).
BOOTSTRAP_DRAWS = 2000


def write_pieces(rows: Sequence[dict[str, Any]], key: str, path: Path) -> None:
    """Per row and piece of the span: masked tokens and correct predictions (tidy CSV)."""
    with atomic_open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["variant", "seed", "eval_len", "piece", "masked", "correct"])
        for row in rows:
            if key not in row:
                continue
            masked, correct = row[key]
            for i, (m, c) in enumerate(zip(masked, correct, strict=True)):
                writer.writerow([row["variant"], row["seed"], row["eval_len"], i, m, c])


def bootstrap_difference(
    masked: Sequence[int],
    correct: Sequence[int],
    base_correct: Sequence[int],
    draws: int = BOOTSTRAP_DRAWS,
    seed: int = 0,
) -> tuple[float, float]:
    """95 % percentile interval of accuracy(variant) - accuracy(base) in points, resampling the
    pieces with replacement (the same pieces for both: the difference is paired), by
    :func:`scipy.stats.bootstrap`. One piece has nothing to resample: its own difference."""
    import numpy as np
    from scipy.stats import bootstrap

    data = tuple(np.asarray(x, dtype=np.float64) for x in (masked, correct, base_correct))

    def difference(m, c, b, axis=-1):  # points of accuracy over the resampled pieces
        return 100.0 * (c.sum(axis) - b.sum(axis)) / np.maximum(m.sum(axis), 1.0)

    if len(data[0]) < 2:  # SciPy needs two observations
        point = float(difference(*data))
        return point, point
    rng = np.random.default_rng(seed)
    found = bootstrap(data, difference, n_resamples=draws, paired=True, vectorized=True,
                      method="percentile", rng=rng)  # fmt: skip
    return float(found.confidence_interval.low), float(found.confidence_interval.high)


def within_seed(rows: Sequence[dict[str, Any]], key: str, base: str = "O") -> pd.DataFrame:
    """Per (variant, length): the bootstrap interval's half-width of variant − base, averaged
    over the seeds both were evaluated with."""
    found = {(r["variant"], r["seed"], r["eval_len"]): r[key] for r in rows if key in r}
    out = []
    for (variant, seed, n), (masked, correct) in found.items():
        ref = found.get((base, seed, n))
        if variant == base or ref is None:
            continue
        low, high = bootstrap_difference(masked, correct, ref[1])
        out.append({"variant": variant, "eval_len": n, "seed": seed, "half": (high - low) / 2})
    frame = pd.DataFrame(out, columns=["variant", "eval_len", "seed", "half"])
    return frame.groupby(["variant", "eval_len"], sort=False)["half"].mean().reset_index()


def markdown_within_seed(frame: pd.DataFrame, lengths: Sequence[int], base: str = "O") -> str:
    head = f"| variant − {base} | " + " | ".join(f"n={n}" for n in lengths) + " |"
    lines = [head, "|---|" + "---:|" * len(lengths)]
    for variant, group in frame.groupby("variant", sort=False):
        by_n = {int(r.eval_len): r.half for r in group.itertuples()}
        cells = [f"±{by_n[n]:.1f}" if n in by_n else "-" for n in lengths]
        lines.append(f"| {variant} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
