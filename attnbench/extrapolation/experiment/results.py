"""What an extrapolation run writes once its rows are in, beside ``extrapolate.csv`` (written
as the rows come): ``pieces.csv`` (each row's per-piece counts), ``table.md`` (mean ± std over
seeds, paired differences to O, Su 2021's published rows beside ours), the figure, and the JSON
sidecar (command, config, corpus, evaluation span, versions, machine, git state).
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import torch

from attnbench.extrapolation.analysis import (
    figures,
    longrange_report,
    loss_report,
    report,
    stats,
)
from attnbench.extrapolation.evaluation.evaluate import EvalStream
from attnbench.extrapolation.experiment.config import ExtrapConfig
from attnbench.extrapolation.experiment.evaluations import PIECES, POSITION_BINS
from attnbench.extrapolation.experiment.plan import RunInputs, RunOptions, threads_per_process
from attnbench.extrapolation.training import curves
from attnbench.measure import machine
from attnbench.runtime.outputs import write_text
from attnbench.runtime.portable import portable

MASKING = (
    "each position replaced by the [MASK] id independently with probability {p} in training and "
    "{q} in evaluation; loss and accuracy over masked positions only; evaluation masks drawn once "
    "over the held-out span (seed {seed}), the same for every variant, seed and length"
)


#: What the causal objective scores, in place of the masking sentence.
NEXT_BYTE = (
    "next-byte prediction with the causal mask: each training window of L bytes predicts its L "
    "next bytes; an evaluation window of n bytes scores its last n - 1 bytes, each predicted by "
    "the position before it (the same bytes for every row at one n); no masks"
)


def masking(cfg: ExtrapConfig) -> str:
    if cfg.model.causal:
        return NEXT_BYTE
    t = cfg.train
    rate = f"{t.mask_prob:g}"
    if t.final_mask_prob:
        rate += f" ({t.final_mask_prob:g} in the last {t.final_mask_steps:,} steps)"
    return MASKING.format(p=rate, q=cfg.eval_mask_prob, seed=cfg.eval.seed)


#: Each row's per-piece (masked, correct) counts (the rows' PIECES entries).
PIECES_NAME = "pieces.csv"

CSV_NAME, SIDECAR_NAME, TABLE_NAME, FIGURE_NAME = (
    "extrapolate.csv",
    "extrapolate.json",
    "table.md",
    "accuracy_vs_length.png",
)


def write_results(cfg: ExtrapConfig, opts: RunOptions, inputs: RunInputs, rows: list[dict],
                  trainings: list[dict], curves_csv: Path | None, started: dt.datetime,
                  device: torch.device, *, load: dict[str, Any] | None = None,
                  warnings: list[str] | None = None) -> str:  # fmt: skip
    """Write pieces.csv, table.md, the figure and the sidecar into ``opts.out``; returns the
    table (Markdown). ``trainings``: each training's summary; ``curves_csv``: the combined
    training curves, if any; ``started``: when the run started (UTC); ``load``: the machine's
    load the run saw (:meth:`attnbench.measure.machine.LoadWatch.stop`) and ``warnings``
    what made the machine slow for it (the training times in the table depend on both)."""
    seeds, stream = inputs.seeds, inputs.stream
    report.write_pieces(rows, PIECES, opts.out / PIECES_NAME)
    loss_report.write_positions(rows, POSITION_BINS, opts.out / loss_report.CSV_NAME)

    lengths = list(cfg.eval.lengths)
    summary = report.summarise(rows)
    title = (
        f"{figures.accuracy_words(cfg.model.causal)} vs length, trained at "
        f"L={cfg.model.train_len}, preset {cfg.preset}, "
        f"{len(seeds)} seed{'s' if len(seeds) > 1 else ''}"
    )
    command = " ".join(["attnbench", *opts.argv[1:]]) if opts.argv else "attnbench"
    command = portable(command, opts.out)  # no path of this machine in a result file
    table_md = _table_markdown(cfg, rows, summary, lengths, title, command, stream)
    write_text(opts.out / TABLE_NAME, table_md)
    figures.draw(rows, lengths, cfg.model.train_len, opts.out / FIGURE_NAME, title,
                 cfg.model.causal)  # fmt: skip
    drawn = _position_figure(cfg, opts, title)
    long_range = _long_range_outputs(cfg, opts, rows, title, command)
    sidecar = _sidecar(cfg, opts, inputs, trainings, curves_csv, started, device, command)
    sidecar.update(load=load, warnings=list(warnings or []))
    sidecar["outputs"] += drawn + long_range
    sidecar = portable(sidecar, opts.out)
    write_text(opts.out / SIDECAR_NAME, json.dumps(sidecar, indent=1, default=str) + "\n")
    return table_md


def _position_figure(cfg: ExtrapConfig, opts: RunOptions, title: str) -> list[str]:
    """loss_by_position.png from positions.csv, when the longest length is beyond L; returns
    the name written (or nothing)."""
    import pandas as pd

    positions = pd.read_csv(opts.out / loss_report.CSV_NAME)
    if positions.empty:
        return []
    what = title.replace(f"{figures.accuracy_words(cfg.model.causal)} vs length",
                         "Loss by position in the window")  # fmt: skip
    drawn = loss_report.position_figure(positions, cfg.model.train_len, cfg.model.causal,
                                        opts.out / loss_report.FIGURE_NAME, what)  # fmt: skip
    return [loss_report.FIGURE_NAME] if drawn else []


def _long_range_outputs(cfg, opts, rows, title, command) -> list[str]:
    """longrange.md and the two-span figure when the rows carry long-range cells (the CSV was
    written as they came); returns the names written."""
    if not longrange_report.cell_rows(rows):
        return []
    md = longrange_report.markdown(rows, cfg.model.train_len, title, command)
    write_text(opts.out / longrange_report.TABLE_NAME, md)
    standard = [r for r in rows if r.get("status") == "ok"]
    longrange_report.figure(standard, rows, cfg.model.train_len,
                           opts.out / longrange_report.FIGURE_NAME, title)  # fmt: skip
    names = longrange_report.CSV_NAME, longrange_report.TABLE_NAME, longrange_report.FIGURE_NAME
    return list(names)


def _sidecar(cfg, opts, inputs, trainings, curves_csv, started, device, command) -> dict[str, Any]:
    """The JSON sidecar: how the table was made, and on what."""
    lengths, stream, seeds = list(cfg.eval.lengths), inputs.stream, inputs.seeds
    corpus, split, notes = inputs.corpus, inputs.split, inputs.notes
    variants, eval_rows = inputs.variants, inputs.eval_rows
    return {
        "suite": "extrapolate",
        "command": command,
        "argv": opts.argv,
        "started": started.isoformat(),
        "finished": dt.datetime.now(dt.timezone.utc).isoformat(),
        "config": cfg.plain(),
        "corpus": corpus.describe() | split.describe(),
        "evaluation": {
            "span_tokens": stream.size,
            "span_masked": int(stream.mask.sum()),
            "span": stream.describe(),
            "masking": masking(cfg),
            "windows": {str(n): stream.windows(n)[0].shape[0] for n in lengths},
            "entropy": f"mean attention-row entropy (nats) per layer over the first "
            f"{cfg.eval.entropy_tokens} tokens of the span (at least one window)",
        },
        "variants": [{"label": v.label, **v.spec.plain(), "kind": "trained"} for v in variants]
        + [
            {
                "label": e.label,
                "kind": "eval-time",
                "applied_to": e.base,
                "tricks": e.tricks.describe(),
            }
            for e in eval_rows
        ],
        "seeds": seeds,
        "trainings": trainings,
        "threads": threads_per_process(cfg),
        "device": str(device),
        "versions": machine.versions(),
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "git": machine.git_state(opts.out),
        "notes": notes,
        "outputs": [CSV_NAME, PIECES_NAME, loss_report.CSV_NAME, TABLE_NAME, FIGURE_NAME]
        + ([curves.COMBINED_NAME] if curves_csv else []),
    }


def _differences(rows, lengths, stream: EvalStream) -> list[str]:
    """The paired differences to O and their within-seed bootstrap; nothing when O is the only
    model row (a run of O alone has no difference to show)."""
    models = {r["variant"] for r in rows if r.get("status") == "ok" and r["kind"] != "baseline"}
    if not models - {"O"}:
        return []
    return [
        report.differences_markdown(rows, lengths),
        "",
        f"Within one seed, the evaluation text's own sampling error: 95 % bootstrap interval "
        f"of variant − O over the span's {stream.pieces} pieces (resampled with replacement, "
        f"{stats.BOOTSTRAP_DRAWS} draws, paired), its half-width averaged over seeds "
        "(points):",
        "",
        stats.markdown_within_seed(stats.within_seed(rows, PIECES), lengths),
        "",
    ]


def _scored(cfg: ExtrapConfig, stream: EvalStream, n: int) -> int:
    """Bytes scored at length n: the masked ones, or (clm) all but each window's first."""
    tokens, mask = stream.windows(n)
    if cfg.model.causal:
        return tokens.shape[0] * (n - 1)
    return int(mask.sum())


def _count_lines(cfg: ExtrapConfig, rows) -> list[str]:
    """The count rows' description, with the examples one model was trained on beside it."""
    if not cfg.model.causal:
        return report.count_rows_markdown(rows, report.TrainingExamples.from_config(cfg))
    lines = report.count_rows_markdown(rows)
    if lines:
        lines[0] = lines[0].replace("the same masked positions", "the same bytes")
        t = cfg.train
        examples = t.steps * t.batch * cfg.model.train_len
        lines.append(
            f"- each trained model, for comparison: {t.steps:,} steps × {t.batch} windows × "
            f"{cfg.model.train_len} positions = {examples:,} next-byte examples."
        )
    return lines


def _table_markdown(cfg, rows, summary, lengths, title, command, stream: EvalStream) -> str:
    causal = cfg.model.causal
    scored = {n: _scored(cfg, stream, n) for n in lengths}
    counts = _count_lines(cfg, rows)
    checks = [] if causal else report.shape_checks(rows)
    what = "Next-byte" if causal else "Masked-token"
    published = "" if causal else (
        " Su 2021's rows are its published numbers (other data and model): compare shapes, not "
        "levels."
    )  # fmt: skip
    return "\n".join(
        [
            f"# {title}",
            "",
            f"Made by: `{command}`",
            "",
            f"{what} accuracy (%), mean ± std over seeds. Eval-time rows reuse the trained O "
            f"weights. Count rows have no model (described below the table).{published}",
            "",
            report.markdown_table(summary, lengths, published=not causal),
            "",
            *([*counts, ""] if counts else []),
            *([*margins, ""] if (margins := report.floor_margins(rows, lengths, None)) else []),
            *_differences(rows, lengths, stream),
            *loss_report.loss_markdown(rows, lengths, cfg.model.train_len, causal),
            *([*probes, ""] if (probes := report.probe_summary(rows, lengths)) else []),
            *(
                [
                    "Su 2021's shape, E − O (on the mean, with its sign count and paired t-test; "
                    "at the training length an equivalence test):",
                    "",
                    *checks,
                    "",
                ]
                if checks
                else []
            ),
            "Training wall time per variant (this machine, threads as in the sidecar):",
            "",
            *report.training_times(rows),
            "",
            ("Objective: " if causal else "Masking: ") + masking(cfg) + ".",
            "",
            f"{'Bytes scored' if causal else 'Masked tokens evaluated'} per length: "
            + ", ".join(f"n={n}: {scored[n]:,}" for n in lengths)
            + f" (one held-out span of {stream.size:,} tokens, the same for every row: "
            f"{stream.pieces} pieces of {stream.chunk:,} contiguous tokens spread evenly over "
            f"the {len(set(stream.works))} held-out works, "
            + ", ".join(f"{w} ({k})" for w, k in stream.describe()["pieces_per_work"].items())
            + ").",
            "",
        ]
    )
