"""Read rows of several extrapolation runs side by side: one table, paired contrasts across runs.

    python scripts/join_tables.py \\
        --run "L=64=results/extrapolate/cpu/extrapolate.csv" \\
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
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from attnbench.extrapolation import report


def labelled(spec: str, rows: list[str], seeds: list[int]) -> pd.DataFrame:
    """The ok model rows of ``LABEL=CSV`` among ``rows`` and ``seeds``, each named
    ``VARIANT [LABEL]``."""
    label, sep, path = spec.rpartition("=")  # a label may hold "=", a path does not
    if not sep or not label or not path:
        raise SystemExit(f"--run {spec!r}: give LABEL=PATH to an extrapolate.csv")
    df = pd.read_csv(path)
    df = df[(df["status"] == "ok") & (df["kind"] != "baseline")]
    df = df[df["variant"].isin(rows) & df["seed"].isin(seeds)].copy()
    missing = set(rows) - set(df["variant"])
    if missing:
        raise SystemExit(f"--run {label}: no rows {sorted(missing)} for seeds {seeds} in {path}")
    df["variant"] = df["variant"] + f" [{label}]"
    return df


def markdown(df: pd.DataFrame, contrasts: list[tuple[str, str]], command: str) -> str:
    lengths = sorted(int(n) for n in df["eval_len"].unique())
    rows = df.to_dict("records")
    lines = [
        f"Made by: `{command}`",
        "",
        "Masked-token accuracy (%), mean ± std over seeds:",
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
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", action="append", required=True, help="LABEL=PATH/extrapolate.csv")
    ap.add_argument("--seeds", required=True, help="comma-separated seeds, e.g. 0,1,2")
    ap.add_argument("--rows", required=True, help="comma-separated variants, e.g. O,E,O+logn")
    ap.add_argument("--contrast", nargs=2, action="append", default=[], metavar=("A", "B"))
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    df = pd.concat([labelled(spec, rows, seeds) for spec in args.run], ignore_index=True)
    command = "python scripts/join_tables.py " + " ".join(
        [*(f'--run "{r}"' for r in args.run), f"--seeds {args.seeds}", f"--rows {args.rows}",
         *(f'--contrast "{a}" "{b}"' for a, b in args.contrast), f"--out {args.out}"]
    )  # fmt: skip
    text = markdown(df, [tuple(c) for c in args.contrast], command)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    print(text, end="")


if __name__ == "__main__":
    main()
