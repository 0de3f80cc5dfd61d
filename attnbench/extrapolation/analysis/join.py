"""Rows of several extrapolation runs side by side: one table, and paired contrasts across runs
(``attnbench merge LABEL=RUN ... --out FILE.md``).

Runs made with different training options (``--set train.…``) are separate tables, each with its
own checkpoints; their models share seeds, text and masks, so a row of one run can be paired by
seed with a row of another. A run is named ``LABEL=RUN`` (RUN its ``extrapolate.csv`` or the
folder holding it); its rows become ``VARIANT [LABEL]``. Only model rows of the chosen rows and
seeds are kept (count rows and Su 2021's published numbers belong to each run's own table). A
contrast ``A - B`` is A − B paired by seed, in the format of the tables' differences (mean [95 %
t-interval] p, sign count; descriptive).

Runs of one training setting evaluated in parts (seeds 0-2 in one run, 3-5 in another, or some
rows in one run and others in another) pool under one label; every seed of a label must have
every chosen row, and a (row, seed, length) found in two runs of one label is refused. The
long-range span (``longrange.csv`` beside each ``extrapolate.csv``) adds the copy accuracy pooled
over the distances d >= L, as ``longrange.md`` pools it, with the same contrasts on it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from attnbench.core.errors import AttnbenchError
from attnbench.extrapolation.analysis import longrange_report, report

#: The file of a run that its folder stands for.
TABLE_NAME = "extrapolate.csv"
#: How a contrast is written: ``A - B`` (or with the minus sign the tables print).
MINUS = (" - ", " − ")


@dataclass(frozen=True)
class Run:
    """One run of a join: its label and its ``extrapolate.csv``."""

    label: str
    csv: Path


def parse_run(text: str) -> Run:
    """``LABEL=RUN`` -> Run; RUN is an ``extrapolate.csv`` or the folder holding one. A label may
    hold ``=`` (``L=64=runs/x``): a path does not."""
    label, sep, where = text.rpartition("=")
    if not sep or not label or not where:
        raise AttnbenchError(
            f"merge: {text!r} is not LABEL=RUN; accepted: a label, '=', and an extrapolation "
            "run's folder or its extrapolate.csv, e.g. L=64=results/extrapolate/cpu"
        )
    path = Path(where)
    csv = path / TABLE_NAME if path.is_dir() else path
    if not csv.is_file():
        raise AttnbenchError(f"merge: {label}={where}: no {TABLE_NAME} there")
    return Run(label, csv)


def parse_contrast(text: str) -> tuple[str, str]:
    """``"A - B"`` -> (A, B)."""
    for minus in MINUS:
        a, sep, b = text.partition(minus)
        if sep and a.strip() and b.strip() and minus not in b:
            return a.strip(), b.strip()
    raise AttnbenchError(
        f"--contrast {text!r}: accepted: 'A - B', two rows of the joined table, e.g. "
        "'O [vary] - O [L=64]'"
    )


def _kept(df: pd.DataFrame, rows: Sequence[str], seeds: Sequence[int], run: Run,
          where: Path) -> pd.DataFrame:  # fmt: skip
    """``df``'s rows among ``rows`` and ``seeds``, each named ``VARIANT [LABEL]`` (with the label
    in column ``run``)."""
    df = df[df["variant"].isin(rows) & df["seed"].isin(seeds)].copy()
    if df.empty:
        raise AttnbenchError(
            f"merge: {run.label}: none of the rows {list(rows)} for seeds {list(seeds)} in {where}"
        )
    df["run"] = run.label
    df["variant"] = df["variant"] + f" [{run.label}]"
    return df


def labelled(run: Run, rows: Sequence[str], seeds: Sequence[int]) -> pd.DataFrame:
    """The ok model rows of ``run`` among ``rows`` and ``seeds``, named ``VARIANT [LABEL]``."""
    df = pd.read_csv(run.csv)
    df = df[(df["status"] == "ok") & (df["kind"] != "baseline")]
    return _kept(df, rows, seeds, run, run.csv)


def long_range(run: Run, rows: Sequence[str], seeds: Sequence[int]) -> pd.DataFrame:
    """The long-range copy accuracy beyond L of ``run`` (its ``longrange.csv``), one row per
    (variant, seed, length) as the standard span's, named ``VARIANT [LABEL]``."""
    cells_path = run.csv.with_name(longrange_report.CSV_NAME)
    if not cells_path.exists():
        raise AttnbenchError(f"merge: {run.label}: --long-range, but there is no {cells_path}")
    cells = pd.read_csv(cells_path)
    cells = cells[cells["variant"].isin(rows) & cells["seed"].isin(seeds)]
    pooled = pd.DataFrame(longrange_report.pooled(cells, beyond=True))
    if pooled.empty:
        raise AttnbenchError(
            f"merge: {run.label}: no cells of {list(rows)} for seeds {list(seeds)} in {cells_path}"
        )
    return _kept(pooled, rows, seeds, run, cells_path)


def joined(frames: Sequence[pd.DataFrame], rows: Sequence[str]) -> pd.DataFrame:
    """The runs' rows in one frame. Every seed of a label must have every row of ``rows`` (from
    one of its runs or several), and a (row, seed, length) in two runs is refused."""
    df = pd.concat(frames, ignore_index=True)
    for label, group in df.groupby("run", sort=False):
        for seed, cells in group.groupby("seed"):  # a run cut short must not pass for a seed
            present = set(cells["variant"])
            short = {r for r in rows if f"{r} [{label}]" not in present}
            if short:
                raise AttnbenchError(
                    f"merge: {label}: seed {int(seed)} has no rows {sorted(short)} in its runs "
                    "(an evaluation cut short?); leave the seed out with --seeds"
                )
    twice = df[df.duplicated(["variant", "seed", "eval_len"], keep=False)]
    if not twice.empty:
        first = twice.iloc[0]
        raise AttnbenchError(
            f"merge: {first['variant']} seed {int(first['seed'])} at n = "
            f"{int(first['eval_len'])} is in two runs of one label: give each run a seed set of "
            "its own (--seeds) or its own label"
        )
    return df


def section(df: pd.DataFrame, contrasts: Sequence[tuple[str, str]], what: str) -> list[str]:
    """The mean ± std table of ``df`` and its paired ``contrasts``."""
    lengths = sorted(int(n) for n in df["eval_len"].unique())
    rows = df.to_dict("records")
    lines = [
        f"{what}, mean ± std over seeds:",
        "",
        report.markdown_table(report.summarise(rows), lengths, published=False),
    ]
    if contrasts:
        frames = []
        for a, b in contrasts:
            frames.append(report.contrast(rows, a, b))
            if frames[-1].empty:
                raise AttnbenchError(f"--contrast '{a} - {b}': no seed has both rows")
        lines += [
            "",
            "Paired by seed (points): mean [95 % t-interval], p of the paired t-test, sign "
            "count; bold where p < 0.05 (descriptive: no correction for the number of cells):",
            "",
            *report.contrast_table(frames, lengths),
        ]
    return lines


def join_runs(
    runs: Sequence[Run],
    rows: Sequence[str],
    seeds: Sequence[int],
    contrasts: Sequence[tuple[str, str]] = (),
    *,
    command: str,
    with_long_range: bool = False,
) -> str:
    """The joined table of ``runs`` as Markdown (its first line: the command that made it)."""
    if not runs:
        raise AttnbenchError("merge: no run to join; accepted: LABEL=RUN, one or more")
    df = joined([labelled(run, rows, seeds) for run in runs], rows)
    lines = [f"Made by: `{command}`", ""]
    lines += section(df, contrasts, "Masked-token accuracy (%)")
    lengths = sorted(int(n) for n in df["eval_len"].unique())
    probe = report.probe_summary(df.to_dict("records"), lengths)
    if probe:
        lines += ["", *probe]
    if with_long_range:
        beyond = joined([long_range(run, rows, seeds) for run in runs], rows)
        train_len = int(beyond["train_len"].iloc[0])
        what = (
            f"Long-range span: copy accuracy (%) over the distances d >= L = {train_len}, scored "
            "bytes pooled over the distances (as longrange.md pools them)"
        )
        lines += ["", *section(beyond, contrasts, what)]
    return "\n".join(lines) + "\n"


def is_extrapolation_run(text: str) -> bool:
    """Whether a ``merge`` argument names an extrapolation run (``LABEL=RUN``, or a folder or
    CSV of one) rather than a speed sweep's folder."""
    where = Path(text.rpartition("=")[2] or text)
    if where.is_dir():
        return (where / TABLE_NAME).is_file() or (where / "extrapolate.json").is_file()
    return where.suffix == ".csv" or "=" in text
