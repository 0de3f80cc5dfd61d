"""The extrapolation suite's tables: tidy CSV, summary table (mean +- std over seeds), the
differences between rows paired by seed; the figure is :mod:`.figures`.

The published rows of Su 2021 (RoFormer small, trained at 64, its own data) are printed
beside ours, labelled "Su 2021"; their numbers are not comparable in level (other data,
tokenizer and model), only in shape.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from attnbench.core.errors import AttnbenchError
from attnbench.extrapolation.analysis import stats
from attnbench.runtime.outputs import atomic_open

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
#: Columns a later attnbench added, last in the header: an older ``extrapolate.csv`` lacks them,
#: so every reader takes them as optional. ``built_from``: how many examples a count row's table
#: was counted from (empty for model rows). ``bits_per_byte``: the loss / ln 2; ``*_beyond_L``:
#: the scores of the positions at or beyond L alone (:mod:`.loss_report`); ``position``: the
#: model row's position encoding. Then per layer ``far_mass_l*`` (the attention mass on keys at
#: least the training length away) and ``score_std_l*`` (the spread of a row's scores), measured
#: with the entropy (:class:`~attnbench.extrapolation.evaluation.evaluate.EntropyProbe`).
ADDED_COLUMNS = ["built_from", "bits_per_byte", "scored_beyond_L", "accuracy_beyond_L",
                 "loss_beyond_L", "position"]  # fmt: skip
PROBE_COLUMNS = ("far_mass_l", "score_std_l")


def columns(layers: int) -> list[str]:
    probes = [f"{name}{i}" for name in PROBE_COLUMNS for i in range(layers)]
    entropy = [f"entropy_l{i}" for i in range(layers)]
    return BASE_COLUMNS + entropy + TAIL_COLUMNS + ADDED_COLUMNS + probes


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


def summarise(rows: Sequence[dict[str, Any]], metric: str = "accuracy") -> pd.DataFrame:
    """Mean, std (over seeds, ddof 1) and seed count of ``metric`` (a column: accuracy, loss...)
    per (variant, kind, eval_len), in the order the variants first appear; failed cells count in
    ``failed``."""
    df = pd.DataFrame(rows)
    order = list(dict.fromkeys(df["variant"]))
    ok = df[df["status"] == "ok"].copy()
    ok[metric] = pd.to_numeric(ok[metric], errors="coerce")
    agg = (
        ok.groupby(["variant", "kind", "eval_len"], sort=False)[metric]
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


#: Columns of a paired-difference frame (:func:`contrast`, :func:`paired_difference`).
DIFF_COLUMNS = ["variant", "base", "eval_len", "mean", "std", "low", "high", "p", "count",
                "positive", "negative"]  # fmt: skip


def _model_rows(rows: Sequence[dict[str, Any]] | pd.DataFrame) -> pd.DataFrame:
    """The rows that have a seed: evaluated models (``ok``), no count rows."""
    df = pd.DataFrame(rows)
    return df[(df["status"] == "ok") & (df["kind"] != "baseline")]


def seed_differences(
    rows: Sequence[dict[str, Any]] | pd.DataFrame, variant: str, base: str,
    metric: str = "accuracy",
) -> pd.DataFrame:  # fmt: skip
    """The pairing behind every difference in the table: per (``eval_len``, ``seed``) where both
    rows were evaluated, ``diff`` = metric(``variant``) - metric(``base``) (accuracy: in points).
    Both rows saw the same windows and masks, and share a seed's initialisation and data order."""
    df = _model_rows(rows)
    key = ["seed", "eval_len"]
    sides = []
    for name in (variant, base):
        side = df[df["variant"] == name][[*key, metric]]
        if side.duplicated(key).any():
            raise AttnbenchError(f"{name}: two rows for one (seed, eval_len); cannot pair by seed")
        sides.append(side)
    joined = sides[0].merge(sides[1], on=key, suffixes=("", "_base"))
    joined = joined.dropna(subset=[metric, f"{metric}_base"])
    joined["diff"] = joined[metric].astype(float) - joined[f"{metric}_base"].astype(float)
    out = joined[["eval_len", "seed", "diff"]].sort_values(["eval_len", "seed"])
    return out.reset_index(drop=True)


def contrast(
    rows: Sequence[dict[str, Any]] | pd.DataFrame, variant: str, base: str,
    metric: str = "accuracy",
) -> pd.DataFrame:  # fmt: skip
    """``variant`` - ``base`` per length, paired by seed (:func:`seed_differences`), as
    :func:`stats.paired` gives it: ``mean``, the 95 % t-interval ``low``..``high``, ``p``
    (paired t-test, two-sided), ``count`` (seeds), ``positive`` and ``negative`` (seeds with
    that sign), and the differences' ``std``; one row per length both were evaluated at."""
    pairs = seed_differences(rows, variant, base, metric)
    out = []
    for n, g in pairs.groupby("eval_len", sort=True):
        test = stats.paired(g["diff"].tolist())
        std = float(g["diff"].std()) if len(g) > 1 else float("nan")
        out.append(
            dict(variant=variant, base=base, eval_len=n, mean=test.mean, std=std, low=test.low,
                 high=test.high, p=test.p, count=test.count, positive=test.positive,
                 negative=test.negative)
        )  # fmt: skip
    return pd.DataFrame(out, columns=DIFF_COLUMNS)


def paired_difference(
    rows: Sequence[dict[str, Any]], base: str = "O", metric: str = "accuracy"
) -> pd.DataFrame:
    """:func:`contrast` of every model row against ``base``, in the order the rows first appear
    (count rows, which have no seed, are left out)."""
    df = _model_rows(rows)
    frames = [contrast(df, v, base, metric) for v in dict.fromkeys(df["variant"]) if v != base]
    frames = [f for f in frames if not f.empty]
    if not frames:
        return pd.DataFrame(columns=DIFF_COLUMNS)
    return pd.concat(frames, ignore_index=True)


def _paired(r: Any) -> stats.Paired:
    return stats.Paired(r.mean, r.low, r.high, r.p, int(r.count), int(r.positive),
                        int(r.negative))  # fmt: skip


def _fmt(mean: float, std: float, count: int) -> str:
    if count == 0 or math.isnan(mean):
        return "-"
    if count == 1 or math.isnan(std):
        return f"{mean:.2f}"
    return f"{mean:.2f} ± {std:.2f}"


def table_cells(
    summary: pd.DataFrame, lengths: Sequence[int], published: bool = True
) -> list[tuple[str, str, list[str]]]:
    """(variant, kind, [cell per length]) rows of the summary, then (``published``) Su 2021's
    published rows."""
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
    for name, values in PUBLISHED.items() if published else ():
        out.append((name, "published", [_pub(values, n) for n in lengths]))
    return out


def _pub(values: dict[int, float], n: int) -> str:
    return f"{values[n]:.2f}" if n in values else "-"


def markdown_table(summary: pd.DataFrame, lengths: Sequence[int], published: bool = True) -> str:
    """The summary as a Markdown table; ``published``: Su 2021's rows below it (the standard
    span only: they were measured on no other)."""
    head = "| variant | kind | " + " | ".join(f"n={n}" for n in lengths) + " |"
    sep = "|---|---|" + "---:|" * len(lengths)
    lines = [head, sep]
    for variant, kind, cells in table_cells(summary, lengths, published):
        lines.append(f"| {variant} | {kind} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _difference_cell(test: stats.Paired) -> str:
    """``**+1.5 [+1.4, +1.6] p < 0.001**, 8/8 seeds positive``: bold where p < 0.05."""
    body = f"**{test.text()}**" if test.significant else test.text()
    return f"{body}, {test.signs()}" if test.count > 1 else body


def _difference_rows(diff: pd.DataFrame, lengths: Sequence[int], label: Any) -> list[str]:
    """One Markdown table row per (variant, base) of ``diff``, named ``label(variant, base)``."""
    lines = []
    for (variant, base), group in diff.groupby(["variant", "base"], sort=False):
        by_n = {int(r.eval_len): r for r in group.itertuples()}
        cells = [_difference_cell(_paired(by_n[n])) if n in by_n else "-" for n in lengths]
        lines.append(f"| {label(variant, base)} | " + " | ".join(cells) + " |")
    return lines


def markdown_difference(diff: pd.DataFrame, lengths: Sequence[int], base: str = "O") -> str:
    """variant − base per length: mean [95 % interval] p over seeds and the sign count;
    significant (p < 0.05) cells in bold."""
    head = f"| variant − {base} | " + " | ".join(f"n={n}" for n in lengths) + " |"
    lines = [head, "|---|" + "---:|" * len(lengths)]
    own = diff[(diff["base"] == base) & (diff["variant"] != base)]
    return "\n".join(lines + _difference_rows(own, lengths, lambda variant, _: variant))


def minus(variant: str, base: str) -> str:
    """``E − O``, ``E − (O+logn)``: a compound name in brackets."""

    def term(name: str) -> str:
        return f"({name})" if any(c in name for c in "+-− ") else name

    return f"{term(variant)} − {term(base)}"


#: Contrasts between two rows other than "variant − O", each with what it asks; printed when
#: both rows exist.
CONTRASTS: tuple[tuple[str, str, str], ...] = (
    (
        "E",
        "O+logn",
        "at a fixed training length E's log factor is a constant temperature, so this asks "
        "whether training with E buys anything over rescaling the trained O by log n at "
        "evaluation",
    ),
)


def markdown_contrasts(
    rows: Sequence[dict[str, Any]],
    lengths: Sequence[int],
    contrasts: Sequence[tuple[str, str, str]] = CONTRASTS,
) -> list[str]:
    """Markdown lines: what each contrast of ``contrasts`` present in ``rows`` asks, then one
    table of them, in the format of the difference to O; [] when none has both rows."""
    found = [(a, b, why, contrast(rows, a, b)) for a, b, why in contrasts]
    found = [(a, b, why, frame) for a, b, why, frame in found if not frame.empty]
    if not found:
        return []
    return [
        "Other contrasts, paired by seed (points), in the same format (descriptive):",
        "",
        *(f"- {minus(a, b)}: {why}." for a, b, why, _ in found),
        "",
        *contrast_table([frame for *_, frame in found], lengths),
    ]


def contrast_table(frames: Sequence[pd.DataFrame], lengths: Sequence[int]) -> list[str]:
    """A Markdown table of :func:`contrast` frames, one row each, named ``variant − base``."""
    head = "| contrast | " + " | ".join(f"n={n}" for n in lengths) + " |"
    table = [head, "|---|" + "---:|" * len(lengths)]
    for frame in frames:
        table += _difference_rows(frame, lengths, minus)
    return table


def differences_markdown(
    rows: Sequence[dict[str, Any]], lengths: Sequence[int], base: str = "O", primary: str = "E"
) -> str:
    """The paired differences to ``base`` (what they are, which one was pre-specified, what the
    sign counts can and cannot say), their table, then the other contrasts
    (:func:`markdown_contrasts`)."""
    diff = paired_difference(rows, base)
    cells = diff[diff["count"] > 1]
    seeds = int(diff["count"].max()) if not diff.empty else 0
    if primary in set(diff["variant"]):
        status = (
            f"{minus(primary, base)} is the pre-specified contrast; every other cell is "
            f"descriptive ({len(cells)} paired t-tests in all, no multiple-comparison "
            "correction applied), so bold elsewhere is a lead, not a finding."
        )
    else:
        status = "Every cell is descriptive (no multiple-comparison correction applied)."
    signs = ""
    if seeds >= 1:
        signs = (
            f" The sign count is a description, not a test: with {seeds} seed"
            f"{'s' if seeds > 1 else ''} no sign or rank test can give a two-sided p below "
            f"2/2^{seeds} = {stats.smallest_sign_p(seeds):.3g}."
        )
    text = (
        f"Difference to {base}, paired by seed (points): mean [95 % t-interval], p of the paired "
        "t-test over seeds, and how many seeds' differences have the mean's sign; bold where "
        f"p < 0.05. A claim without bold is not established by these seeds. {status}{signs}"
    )
    parts = [text, "", markdown_difference(diff, lengths, base)]
    if extra := markdown_contrasts(rows, lengths):
        parts += ["", *extra]
    return "\n".join(parts)


#: The issue's reading of Su 2021's shape, on the mean over seeds of E - O (points):
#: (length, test, threshold, words). "abs<=" is read with an equivalence test (TOST).
SHAPE_CHECKS = (
    (64, "abs<=", 1.5, "|E − O| ≤ 1.5 at n = 64 (the training length)"),
    (128, ">=", -0.5, "E − O ≥ −0.5 at n = 128"),
    (256, ">=", 3.0, "E − O ≥ 3 at n = 256"),
    (512, ">=", 3.0, "E − O ≥ 3 at n = 512"),
    (1024, ">=", 0.0, "E ≥ O at n = 1024"),
)


def _ahead(test: stats.Paired, variant: str) -> str:
    if test.count < 2:
        return "one seed: no test"
    if test.significant and test.mean > 0:
        return f"{variant} ahead, significant at 0.05"
    return "not significant at 0.05"


def shape_checks(rows: Sequence[dict[str, Any]], variant: str = "E", base: str = "O") -> list[str]:
    """Markdown bullet lines: does ``variant`` − ``base`` meet Su 2021's shape at each length on
    the mean, with its sign count and paired t-test; "within ±margin" is an equivalence test
    (:func:`stats.equivalence`, TOST), so a non-significant difference is never called equal."""
    pairs = seed_differences(rows, variant, base)
    lines = []
    for n, test, threshold, words in SHAPE_CHECKS:
        values = pairs[pairs["eval_len"] == n]["diff"].tolist()
        if not values:
            continue
        r = stats.paired(values)
        ok = abs(r.mean) <= threshold if test == "abs<=" else r.mean >= threshold
        signs = f", {r.signs()}" if r.count > 1 else ""
        if test == "abs<=":
            verdict = stats.equivalence(values, threshold).text()
        else:
            verdict = _ahead(r, variant)
        lines.append(
            f"- {words}: {'yes' if ok else 'no'} on the mean ({r.text(2)}{signs}); {verdict}"
        )
    return lines


# --------------------------------------------------------------------------------------------
# The count rows (no model)
# --------------------------------------------------------------------------------------------

#: The count rows' labels (written by the evaluations): the fair floor, and the first rule kept
#: beside it. A CSV written before the fair floor has only ``count-baseline``, with the first
#: rule's note and no ``built_from``.
FLOOR_LABEL, BACKOFF_LABEL = "count-baseline", "count-backoff"
#: The fair table counted at the evaluation's masking rate (the stricter floor when training
#: masks more than the evaluation).
EVAL_MASKS_LABEL = "count-eval-masks"
#: The floors a model row is read against, in the order the tables list them.
FAIR_FLOORS = (FLOOR_LABEL, EVAL_MASKS_LABEL)


@dataclass(frozen=True)
class TrainingExamples:
    """How many masked examples one training saw, as its config expects them: ``steps`` x
    ``batch`` windows x ``train_len`` positions x ``mask_prob`` (each position is masked at
    random, so the count a training really drew varies around this). With a closing phase at
    another rate, ``mask_prob`` is the mean over the steps and ``phases`` says which rates."""

    steps: int
    batch: int
    train_len: int
    mask_prob: float
    phases: str = ""  # e.g. "0.4, the last 1,000 steps 0.15"; "": one rate

    @classmethod
    def from_config(cls, cfg: Any) -> TrainingExamples:
        """From an :class:`~attnbench.extrapolation.experiment.config.ExtrapConfig`."""
        t = cfg.train
        phases = ""
        if t.final_mask_prob:
            phases = f"{t.mask_prob:g}, the last {t.final_mask_steps:,} steps {t.final_mask_prob:g}"
        return cls(t.steps, t.batch, cfg.model.train_len, t.masked_share(), phases)

    @property
    def expected(self) -> float:
        return self.steps * self.batch * self.train_len * self.mask_prob

    def text(self) -> str:
        rate = f"{self.mask_prob:.4g} masked" + (f" ({self.phases})" if self.phases else "")
        return (
            f"{self.steps:,} steps × {self.batch} windows × {self.train_len} positions × "
            f"{rate} = {self.expected:,.0f} masked examples (expected)"
        )


def _first_text(values: pd.Series) -> str:
    found = [str(v) for v in values if isinstance(v, str) and v.strip()]
    return found[0] if found else ""


def _built_from(group: pd.DataFrame) -> str:
    """``built from 1,843,200 examples`` from the rows' ``built_from`` (absent in a CSV older
    than the column: "not recorded")."""
    if "built_from" not in group:
        return "examples counted: not recorded in these rows"
    counts = sorted({int(v) for v in pd.to_numeric(group["built_from"]).dropna()})
    if not counts:
        return "examples counted: not recorded in these rows"
    return "built from " + " or ".join(f"{c:,}" for c in counts) + " examples"


def count_rows_markdown(
    rows: Sequence[dict[str, Any]], model: TrainingExamples | None = None
) -> list[str]:
    """Markdown lines describing the count rows present (each by its own ``note``, so an older
    CSV's ``count-baseline`` reads as the rule it was), with how many examples each table was
    built from, and beside them the masked examples a model trained on (``model``); [] when the
    rows have no count row."""
    df = pd.DataFrame(rows)
    floors = df[df["kind"] == "baseline"]
    if floors.empty:
        return []
    fair = [f"`{f}`" for f in FAIR_FLOORS if f in set(floors["variant"])]
    against = ""
    if len(fair) == 2:
        against = (
            f"; read every model row against both {fair[0]} and {fair[1]}: a row clears the "
            "floor only above the higher of the two"
        )
    elif fair:
        against = f"; read every model row against {fair[0]}"
    lines = [
        f"Count rows (no model), scored on the same masked positions as the models{against}:",
        "",
    ]
    for variant, group in floors.groupby("variant", sort=False):
        note = _first_text(group["note"]) if "note" in group else ""
        lines.append(f"- `{variant}`: {note or 'no description in the rows'}; "
                     f"{_built_from(group)}.")  # fmt: skip
    if model is not None:
        lines.append(f"- each trained model, for comparison: {model.text()}.")
    return lines


def floor_margins(
    rows: Sequence[dict[str, Any]], lengths: Sequence[int],
    variants: Sequence[str] | None = ("O", "E"),
) -> list[str]:  # fmt: skip
    """Markdown: each of ``variants`` (None: every trained row) minus each fair floor
    (:data:`FAIR_FLOORS`) at every length, over seeds (mean [95 % t-interval] p, seeds above the
    floor); [] without a floor or a model row. The floor has no seed: the interval is the seeds'
    spread around it."""
    df = pd.DataFrame(rows)
    if df.empty or "kind" not in df:
        return []
    ok = df[df["status"] == "ok"]
    floors = [f for f in FAIR_FLOORS if f in set(ok["variant"])]
    if variants is None:
        variants = list(dict.fromkeys(ok[ok["kind"] == "trained"]["variant"]))
    models = [v for v in variants if v in set(ok[ok["kind"] != "baseline"]["variant"])]
    if not floors or not models:
        return []
    head = "| row − floor | " + " | ".join(f"n = {n}" for n in lengths) + " |"
    lines = [
        "Margin over each fair floor (points; mean over seeds [95 % t-interval] p, and how many "
        "seeds are above it; descriptive):",
        "",
        head,
        "|---|" + "---:|" * len(lengths),
    ]
    for model in models:
        for floor in floors:
            cells = []
            for n in lengths:
                level = ok[(ok["variant"] == floor) & (ok["eval_len"] == n)]["accuracy"]
                seeds = ok[(ok["variant"] == model) & (ok["eval_len"] == n)]["accuracy"]
                if level.empty or seeds.empty:
                    cells.append("-")
                    continue
                r = stats.paired((seeds - float(level.iloc[0])).tolist())
                cells.append(_difference_cell(r) if r.count > 1 else f"{r.mean:+.2f}")
            lines.append(f"| {model} − `{floor}` | " + " | ".join(cells) + " |")
    return lines


def probe_summary(rows: Sequence[dict[str, Any]], lengths: Sequence[int]) -> list[str]:
    """Markdown: where the attention goes, per model row and length (mean over layers and
    seeds): the share of the attention mass on keys at least the training length away, and the
    spread (standard deviation) of a row's scores; [] when the rows hold no probe columns."""
    df = pd.DataFrame(rows)
    far = [c for c in df.columns if c.startswith("far_mass_l")]
    spread = [c for c in df.columns if c.startswith("score_std_l")]
    if not far or df[far].isna().all().all():
        return []
    ok = df[(df["status"] == "ok") & (df["kind"] != "baseline")].copy()
    ok["far"] = ok[far].apply(pd.to_numeric, errors="coerce").mean(axis=1)
    ok["spread"] = ok[spread].apply(pd.to_numeric, errors="coerce").mean(axis=1)
    ok = ok.dropna(subset=["far"])
    if ok.empty:
        return []
    cols = " | ".join(f"n = {n}" for n in lengths)
    lines = [
        "Where the attention goes (on the probed windows; mean over layers and seeds): the "
        "attention mass on keys at least the training length away (%), and in brackets the "
        "standard deviation of a row's scores as the softmax sees them (nats):",
        "",
        f"| row | {cols} |",
        "|---|" + "---:|" * len(lengths),
    ]
    for variant, g in ok.groupby("variant", sort=False):
        cells = []
        for n in lengths:
            at = g[g["eval_len"] == n]
            cells.append(
                "-" if at.empty else f"{100 * at['far'].mean():.1f} ({at['spread'].mean():.2f})"
            )
        lines.append(f"| {variant} | " + " | ".join(cells) + " |")
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
