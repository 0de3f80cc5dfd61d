"""Before and after a change, measured side by side: a speed run of an older revision and of this
checkout, alternately, on one machine in one sitting, read as ratios each run measured itself.

    python scripts/before_after.py --base edfe279 --out runs/before-after --pairs 2 \\
        --peer local:efficient=local:local-attention \\
        -- --suite long --lengths 8192 --direction fwd

Everything after ``--`` is passed to ``attnbench run speed`` (``--out`` and ``--no-plot`` are
added). The older revision runs from a temporary ``git worktree`` on ``PYTHONPATH``, as ``attnbench
gate --base`` runs it (the package is pure Python); the runs go base, current, base, current, ...
(``--pairs`` of each), every run in its own process, so that a drift of the machine during the
sitting falls on both sides alike.

A time measured in one process is not compared with one measured in another. Each row is read
through what its own run measured in the same rounds:

* ``matmul``: the case's time in units of the float32 matmul anchor of its rounds (time x the
  anchor's FLOP/s), the speed suite's roofline without the case's FLOP count; the fraction of the
  matmul rate is the current code's FLOPs over that, for both sides, so that a changed FLOP
  convention cannot move the "before" column;
* ``ref_ratio``: the case's time over dense SDPA's (the suite's reference) in the same rounds;
* ``--peer PATH=PEER``: PEER's time over PATH's in the same run (the same case, the same rounds).

Each column is the median over the runs of one side; ``after / before`` is the ratio of the two
sides' medians of the normalised time. ``OUT/table.md`` and ``OUT/table.csv`` hold the table;
every run's folder is kept. Exit 2 if a side fails to run.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
#: What makes two rows of one run the same case (with the path).
CASE = ["direction", "causal", "seq_len", "dtype"]


def git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)


def speed_run(code_root: Path, out: Path, args: list[str]) -> None:
    env = {**os.environ, "PYTHONPATH": str(code_root)}
    cmd = [sys.executable, "-m", "attnbench", "run", "speed", *args, "--out", str(out),
           "--overwrite", "--no-plot"]  # fmt: skip
    print(f"{out.name}: {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
    with (out.parent / f"{out.name}.log").open("w") as log:
        done = subprocess.run(cmd, cwd=code_root, env=env, stdout=log, stderr=subprocess.STDOUT)
    if done.returncode != 0 or not (out / "results.csv").is_file():
        raise SystemExit(f"{out.name}: the speed run failed (exit {done.returncode}); see its log")


def side_rows(runs: list[Path], peers: dict[str, str]) -> pd.DataFrame:
    """One row per case and run, with its normalised time and, for a PATH of ``peers``, the
    peer's time over its own in the same run (the same direction, causality, n and dtype)."""
    frames = []
    for k, run in enumerate(runs):
        df = pd.read_csv(run / "results.csv")
        df = df[df["status"] == "ok"].copy()
        df["run"] = k
        df["impl"] = df["mechanism"] + ":" + df["path"]
        df["matmul_units"] = df["time_median_ms"] * 1e-3 * df["matmul_flop_per_s"]
        df["peer_ratio"] = float("nan")
        times = df.set_index(["impl", *CASE])["time_median_ms"]
        for path, peer in peers.items():
            mine = df["impl"] == path
            cases = df.loc[mine, CASE].itertuples(index=False)
            for i, case in zip(df.index[mine], cases, strict=True):
                theirs = times.get((peer, *case))
                if theirs is not None:
                    df.loc[i, "peer_ratio"] = theirs / df.loc[i, "time_median_ms"]
        frames.append(df)
    return pd.concat(frames, ignore_index=True)


def table(base_runs: list[Path], current_runs: list[Path], peers: dict[str, str]) -> pd.DataFrame:
    """One row per case measured on both sides: medians over each side's runs."""
    cols = ["matmul_units", "ref_ratio", "peer_ratio"]
    sides, flops = {}, None
    for name, runs in (("before", base_runs), ("after", current_runs)):
        grouped = side_rows(runs, peers).groupby(["impl", *CASE])
        sides[name] = grouped[cols].median()
        flops = grouped["flops"].first()  # the current code's count (the last side read)
    out = sides["before"].merge(sides["after"], left_index=True, right_index=True,
                                suffixes=("_before", "_after"))  # fmt: skip
    out = out.join(flops)
    for side in ("before", "after"):
        out[f"matmul_fraction_{side}"] = out["flops"] / out[f"matmul_units_{side}"]
        out[f"vs_sdpa_{side}"] = 1 / out[f"ref_ratio_{side}"]
        out[f"vs_peer_{side}"] = out[f"peer_ratio_{side}"]
    out["after_over_before"] = out["matmul_units_before"] / out["matmul_units_after"]
    measures = ("matmul_fraction", "vs_sdpa", "vs_peer")
    keep = [f"{m}_{s}" for m in measures for s in ("before", "after")]
    return out[[*keep, "after_over_before"]].reset_index()


def markdown(df: pd.DataFrame, base: str) -> str:
    def pct(x: float) -> str:
        return "" if pd.isna(x) else f"{100 * x:.1f} %"

    def times(x: float) -> str:
        return "" if pd.isna(x) else f"{x:.2f}x"

    lines = [
        f"| path | direction | causal | n | matmul rate, before ({base}) | after | "
        "vs dense SDPA, before | after | vs peer, before | after | speed-up |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in df.itertuples():
        lines.append(
            f"| `{r.impl}` | {r.direction} | {'yes' if r.causal else 'no'} | {r.seq_len} | "
            f"{pct(r.matmul_fraction_before)} | {pct(r.matmul_fraction_after)} | "
            f"{times(r.vs_sdpa_before)} | {times(r.vs_sdpa_after)} | {times(r.vs_peer_before)} | "
            f"{times(r.vs_peer_after)} | {times(r.after_over_before)} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    run_args = argv[argv.index("--") + 1 :] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="the revision measured as 'before'")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--pairs", type=int, default=2, help="runs of each side, alternating")
    ap.add_argument("--peer", action="append", default=[], metavar="PATH=PEER",
                    help="a peer path read against PATH in the same run (repeatable)")  # fmt: skip
    args = ap.parse_args(own)
    peers = dict(p.split("=", 1) for p in args.peer)
    sha = git("rev-parse", "--verify", "--quiet", f"{args.base}^{{commit}}").stdout.strip()
    if not sha:
        raise SystemExit(f"--base {args.base}: no such revision")
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="attnbench-before-"))
    tree = tmp / "base"
    if git("worktree", "add", "--detach", str(tree), sha).returncode != 0:
        raise SystemExit(f"could not check out {args.base}")
    base_runs, current_runs = [], []
    try:
        for k in range(1, args.pairs + 1):
            sides = (("base", tree, base_runs), ("current", ROOT, current_runs))
            for side, code_root, runs in sides:
                run = out / f"{side}-{k}"
                speed_run(code_root, run, run_args)
                runs.append(run)
    finally:
        git("worktree", "remove", "--force", str(tree))
        shutil.rmtree(tmp, ignore_errors=True)
    df = table(base_runs, current_runs, peers)
    df.to_csv(out / "table.csv", index=False)
    text = markdown(df, f"{args.base} = {sha[:10]}")
    (out / "table.md").write_text(text)
    print(text, end="")


if __name__ == "__main__":
    main()
