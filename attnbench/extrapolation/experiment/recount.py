"""``attnbench run extrapolate ... --floors-only --out RUN``: count the floors of a finished run
again with today's rules, on the same held-out windows and masks, without its models.

A run made before a floor existed (the mask-aware ``count-baseline`` of 2026-11, the
``count-eval-masks`` table counted at the evaluation's masking rate) keeps its models' rows; its
count rows are replaced by the floors of :func:`~attnbench.extrapolation.experiment.evaluations.
baseline_rows`, computed from the config the run was made with (the same options are given
again, and checked against the run's sidecar), and ``extrapolate.csv``, ``table.md`` and the
figure are written again. An older ``count-baseline`` that was the back-off rule becomes
``count-backoff`` by being counted again under that name (the same rule on the same text gives
the same numbers: a check). The sidecar keeps what it said and gains ``floors_recounted`` (the
command, when, the versions). Needs no GPU and no checkpoint: the models' rows are read, not made.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from pathlib import Path
from typing import Any

import pandas as pd

from attnbench.core.errors import AttnbenchError
from attnbench.extrapolation.analysis import figures, report
from attnbench.extrapolation.experiment.config import ExtrapConfig
from attnbench.extrapolation.experiment.evaluations import PIECES, baseline_rows
from attnbench.extrapolation.experiment.plan import RunOptions, read_inputs
from attnbench.extrapolation.experiment.results import (
    CSV_NAME,
    FIGURE_NAME,
    PIECES_NAME,
    SIDECAR_NAME,
    TABLE_NAME,
    _table_markdown,
)
from attnbench.measure import machine
from attnbench.runtime.outputs import write_text
from attnbench.runtime.portable import portable
from attnbench.runtime.schema import key_difference

#: The config keys that decide the floors' numbers: the text, the training batches the tables
#: are counted from, and the evaluation windows and masks they are scored on.
FLOOR_KEYS = {
    "model": ("train_len",),
    "train": ("batch", "steps", "mask_prob", "final_mask_prob", "final_mask_steps",
              "window_lengths", "copy_share"),
    "eval": ("lengths", "tokens", "seed", "mask_prob"),
    "run": ("seed_start", "holdout"),
}  # fmt: skip
#: The text itself is compared by its digest (a path in the sidecar is relative to where the run
#: was written, so the same file can be named differently).


def recount_floors(cfg: ExtrapConfig, opts: RunOptions) -> str:
    """Replace the count rows of the run in ``opts.out`` (see the module docstring); returns
    its new table (Markdown)."""
    run = opts.out
    sidecar = _read_sidecar(run)
    _check_same_floors(cfg, sidecar["config"], run)
    rows = _model_rows(run)
    inputs = read_inputs(cfg, opts)
    _check_same_text(sidecar.get("corpus", {}), inputs.corpus.describe(), run)
    floors = baseline_rows(cfg, inputs.split.train, inputs.stream)
    _check_same_masks(rows, floors, run)
    rows += floors
    report.write_csv(rows, run / CSV_NAME)
    lengths = list(cfg.eval.lengths)
    summary = report.summarise(rows)
    seeds = sorted({int(r["seed"]) for r in rows if r.get("seed") is not None})
    title = (
        f"MLM accuracy (%) vs length, trained at L={cfg.model.train_len}, preset {cfg.preset}, "
        f"{len(seeds)} seed{'s' if len(seeds) > 1 else ''}"
    )
    made = sidecar.get("command", "")
    recounted = portable(" ".join(["attnbench", *opts.argv[1:]]), run)
    command = f"{made}`; floors counted again by `{recounted}"
    table = _table_markdown(cfg, rows, summary, lengths, title, command, inputs.stream)
    write_text(run / TABLE_NAME, table)
    figures.figure(summary, lengths, cfg.model.train_len, run / FIGURE_NAME, title)
    sidecar["floors_recounted"] = portable(
        {
            "command": recounted,
            "at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "floors": sorted({r["variant"] for r in floors}),
            "versions": machine.versions(),
            "git": machine.git_state(run),
        },
        run,
    )
    write_text(run / SIDECAR_NAME, json.dumps(sidecar, indent=1, default=str) + "\n")
    return table


def _read_sidecar(run: Path) -> dict[str, Any]:
    for name in (CSV_NAME, SIDECAR_NAME, PIECES_NAME):
        if not (run / name).is_file():
            raise AttnbenchError(
                f"--floors-only: {run} has no {name}; accepted: the --out folder of a finished "
                "run extrapolate"
            )
    return json.loads((run / SIDECAR_NAME).read_text(encoding="utf-8"))


def _check_same_floors(cfg: ExtrapConfig, saved: dict[str, Any], run: Path) -> None:
    """The options given must make the run's floors: every key of FLOOR_KEYS the sidecar
    recorded equals today's (a key it lacks did not exist then: its default is what ran)."""
    plain = cfg.plain()
    then = {s: {k: saved.get(s, {})[k] for k in keys if k in saved.get(s, {})}
            for s, keys in FLOOR_KEYS.items()}  # fmt: skip
    now = {s: {k: plain[s][k] for k in then[s]} for s in FLOOR_KEYS}
    diff = key_difference(json.loads(json.dumps(then)), json.loads(json.dumps(now)))
    if diff:
        raise AttnbenchError(
            f"--floors-only: {run} was made with other options ({diff}); give the options of "
            f"its command: {saved.get('command', '(not recorded)')}"
        )


def _check_same_text(then: dict[str, Any], now: dict[str, Any], run: Path) -> None:
    if then.get("sha256") and then["sha256"] != now.get("sha256"):
        raise AttnbenchError(
            f"--floors-only: {run} was made from another text (sha256 {then['sha256'][:12]}..., "
            f"this one {str(now.get('sha256'))[:12]}...); accepted: the --corpus of its command"
        )


def _model_rows(run: Path) -> list[dict[str, Any]]:
    """The run's rows other than its count rows, each with its pieces (for the within-seed
    bootstrap of the table)."""
    df = pd.read_csv(run / CSV_NAME)
    df = df[df["kind"] != "baseline"]
    rows = [{k: _plain(v) for k, v in r.items()} for r in df.to_dict("records")]
    for row in rows:
        row["seed"] = None if row.get("seed") is None else int(row["seed"])
    pieces = pd.read_csv(run / PIECES_NAME)
    by_row = {key: g.sort_values("piece") for key, g in pieces.groupby(["variant", "seed",
                                                                          "eval_len"])}  # fmt: skip
    for row in rows:
        key = (row["variant"], row["seed"], row["eval_len"])
        if key in by_row:
            g = by_row[key]
            row[PIECES] = (g["masked"].tolist(), g["correct"].tolist())
    return rows


def _plain(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def _check_same_masks(rows: list[dict[str, Any]], floors: list[dict[str, Any]], run: Path):
    """The floors are scored on the run's own masked positions: as many at every length."""
    scored = {r["eval_len"]: r["masked_tokens"] for r in rows if r.get("status") == "ok"}
    for f in floors:
        n = f["eval_len"]
        if n in scored and int(scored[n]) != int(f["masked_tokens"]):
            raise AttnbenchError(
                f"--floors-only: at n={n} the run scored {int(scored[n])} masked tokens, these "
                f"options give {f['masked_tokens']}: not the run's evaluation span"
            )
