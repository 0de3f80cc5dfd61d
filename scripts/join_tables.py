"""Read rows of several extrapolation runs side by side: one table, paired contrasts across runs.

    python scripts/join_tables.py \\
        --run "L=64=results/extrapolate/cpu-before-swiglu/extrapolate.csv" \\
        --run "16,32,64=results/extrapolate/cpu-varying-lengths/extrapolate.csv" \\
        --seeds 0,1,2 --rows O,E,O+logn \\
        --contrast "O [16,32,64]" "O [L=64]" --contrast "E [16,32,64]" "E [L=64]" \\
        --out results/extrapolate/cpu-varying-lengths/joined.md

Runs made with different training options (``--set train.…``) are separate tables, each with its
own checkpoints; their models share seeds, text and masks, so a row of one run can be paired by
seed with a row of another. ``--run LABEL=CSV`` names a run's ``extrapolate.csv``; its rows become
``VARIANT [LABEL]``. Only model rows of the listed ``--rows`` and ``--seeds`` are kept (count
rows and Su 2021's published numbers belong to each run's own table). ``--contrast A B`` adds
A − B, paired by seed, in the format of the tables' differences (mean [95 % t-interval] p, sign
count; descriptive). Writes Markdown to ``--out`` (and prints it).

Runs of one training setting evaluated in parts (seeds 0-2 in one run, 3-5 in another, or some
rows in one run and others in another) pool under one label: ``--run "copies=A/extrapolate.csv"
--run "copies=B/extrapolate.csv"``; every label must have every ``--rows`` row, and a (row,
seed, length) found in two runs of one label stops the script. ``--long-range`` adds the long-range
span (``longrange.csv`` beside each ``extrapolate.csv``): the copy accuracy pooled over the
distances d >= L, as ``longrange.md`` pools it, with the same contrasts on it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from attnbench.extrapolation.analysis import longrange_report, report


def _spec(spec: str) -> tuple[str, Path]:
    label, sep, path = spec.rpartition("=")  # a label may hold "=", a path does not
    if not sep or not label or not path:
        raise SystemExit(f"--run {spec!r}: give LABEL=PATH to an extrapolate.csv")
    return label, Path(path)


def _kept(df: pd.DataFrame, rows: list[str], seeds: list[int], label: str, path: Path):
    """``df``'s rows among ``rows`` and ``seeds``, each named ``VARIANT [LABEL]`` (with the
    label in column ``run``)."""
    df = df[df["variant"].isin(rows) & df["seed"].isin(seeds)].copy()
    if df.empty:
        raise SystemExit(f"--run {label}: none of the rows {rows} for seeds {seeds} in {path}")
    df["run"] = label
    df["variant"] = df["variant"] + f" [{label}]"
    return df


def labelled(spec: str, rows: list[str], seeds: list[int]) -> pd.DataFrame:
    """The ok model rows of ``LABEL=CSV`` among ``rows`` and ``seeds``, each named
    ``VARIANT [LABEL]``."""
    label, path = _spec(spec)
    df = pd.read_csv(path)
    df = df[(df["status"] == "ok") & (df["kind"] != "baseline")]
    return _kept(df, rows, seeds, label, path)


def long_range(spec: str, rows: list[str], seeds: list[int]) -> pd.DataFrame:
    """The long-range copy accuracy beyond L of the run ``LABEL=CSV`` (its ``longrange.csv``),
    one row per (variant, seed, length) as the standard span's, named ``VARIANT [LABEL]``."""
    label, path = _spec(spec)
    cells_path = path.with_name(longrange_report.CSV_NAME)
    if not cells_path.exists():
        raise SystemExit(f"--run {label}: --long-range, but there is no {cells_path}")
    cells = pd.read_csv(cells_path)
    cells = cells[cells["variant"].isin(rows) & cells["seed"].isin(seeds)]
    pooled = pd.DataFrame(longrange_report.pooled(cells, beyond=True))
    if pooled.empty:
        raise SystemExit(f"--run {label}: no cells of {rows} for seeds {seeds} in {cells_path}")
    return _kept(pooled, rows, seeds, label, cells_path)


def joined(frames: list[pd.DataFrame], rows: list[str]) -> pd.DataFrame:
    """The runs' rows in one frame. Every seed of a label must have every row of ``rows`` (from
    one of its runs or several), and a (row, seed, length) in two runs stops the script."""
    df = pd.concat(frames, ignore_index=True)
    for label, group in df.groupby("run", sort=False):
        for seed, cells in group.groupby("seed"):  # a run cut short must not pass for a seed
            present = set(cells["variant"])
            short = {r for r in rows if f"{r} [{label}]" not in present}
            if short:
                raise SystemExit(
                    f"--run {label}: seed {int(seed)} has no rows {sorted(short)} in its runs "
                    "(an evaluation cut short?); leave the seed out with --seeds"
                )
    twice = df[df.duplicated(["variant", "seed", "eval_len"], keep=False)]
    if not twice.empty:
        first = twice.iloc[0]
        raise SystemExit(
            f"{first['variant']} seed {int(first['seed'])} at n = {int(first['eval_len'])} is in "
            "two runs of one label: give each run a seed set of its own (--seeds) or its own label"
        )
    return df


def section(df: pd.DataFrame, contrasts: list[tuple[str, str]], what: str) -> list[str]:
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
                raise SystemExit(f"--contrast {a!r} {b!r}: no seed has both rows")
        lines += [
            "",
            "Paired by seed (points): mean [95 % t-interval], p of the paired t-test, sign "
            "count; bold where p < 0.05 (descriptive: no correction for the number of cells):",
            "",
            *report.contrast_table(frames, lengths),
        ]
    return lines


def markdown(
    df: pd.DataFrame,
    contrasts: list[tuple[str, str]],
    command: str,
    beyond: pd.DataFrame | None = None,
) -> str:
    lines = [f"Made by: `{command}`", ""]
    lines += section(df, contrasts, "Masked-token accuracy (%)")
    if beyond is not None:
        train_len = int(beyond["train_len"].iloc[0])
        what = (
            f"Long-range span: copy accuracy (%) over the distances d >= L = {train_len}, scored "
            "bytes pooled over the distances (as longrange.md pools them)"
        )
        lines += ["", *section(beyond, contrasts, what)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", action="append", required=True, help="LABEL=PATH/extrapolate.csv")
    ap.add_argument("--seeds", required=True, help="comma-separated seeds, e.g. 0,1,2")
    ap.add_argument("--rows", required=True, help="comma-separated variants, e.g. O,E,O+logn")
    ap.add_argument("--contrast", nargs=2, action="append", default=[], metavar=("A", "B"))
    ap.add_argument("--long-range", action="store_true", help="add the long-range span")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    df = joined([labelled(spec, rows, seeds) for spec in args.run], rows)
    beyond = None
    if args.long_range:
        beyond = joined([long_range(spec, rows, seeds) for spec in args.run], rows)
    command = "python scripts/join_tables.py " + " ".join(
        [*(f'--run "{r}"' for r in args.run), f"--seeds {args.seeds}", f"--rows {args.rows}",
         *(f'--contrast "{a}" "{b}"' for a, b in args.contrast),
         *(["--long-range"] if args.long_range else []), f"--out {args.out}"]
    )  # fmt: skip
    text = markdown(df, [tuple(c) for c in args.contrast], command, beyond)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    print(text, end="")


if __name__ == "__main__":
    main()
