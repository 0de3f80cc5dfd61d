"""The run's evaluations as picklable tasks (:class:`EvalTask`: a trained checkpoint, an
eval-time row on the trained O's weights, or the count baseline), run here or in worker processes
(:func:`evaluate_tasks`), and the tidy rows they give:
one per (variant, seed, length), with ``status`` ``ok``, or ``error`` and the reason when a
mechanism cannot run at that length (never a dropped row or a bare NaN).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from attnbench.core.errors import AttnbenchError
from attnbench.extrapolation.analysis import longrange_report
from attnbench.extrapolation.evaluation import causal_floor, longrange
from attnbench.extrapolation.evaluation import floors as baseline
from attnbench.extrapolation.evaluation.evaluate import EvalResult, EvalStream, evaluate
from attnbench.extrapolation.evaluation.targets import make_targets
from attnbench.extrapolation.experiment.config import (
    EvalTimeVariant,
    ExtrapConfig,
    TrainedVariant,
    spec_json,
)
from attnbench.extrapolation.experiment.plan import Plan
from attnbench.extrapolation.model.encoder import MLMEncoder, build_model, position_of
from attnbench.extrapolation.model.position_encodings import row_note
from attnbench.extrapolation.model.positions import EvalPositions
from attnbench.extrapolation.model.tricks import trick_mixers
from attnbench.extrapolation.training.checkpoints import load_checkpoint
from attnbench.runtime import logs
from attnbench.runtime.execute import Executor, UnitEnd, Work, run_units

#: The row key holding a row's per-piece (masked, correct) counts, written to pieces.csv.
PIECES = "_pieces"
#: The row key holding a row's per-position bins (:attr:`EvalResult.bins`), positions.csv.
POSITION_BINS = "_positions"


def beyond(res: EvalResult, train_len: int) -> dict[str, Any]:
    """The scores of the positions at or beyond L (the bins starting there): ``scored_beyond_L``,
    ``accuracy_beyond_L`` and ``loss_beyond_L`` (None when a window has no such position)."""
    far = [b for b in res.bins if b[0] >= train_len]
    scored = sum(b[2] for b in far)
    if not scored:
        return {"scored_beyond_L": 0, "accuracy_beyond_L": None, "loss_beyond_L": None}
    return {
        "scored_beyond_L": scored,
        "accuracy_beyond_L": 100.0 * sum(b[3] for b in far) / scored,
        "loss_beyond_L": sum(b[4] for b in far) / scored,
    }


def _row(cfg, label, kind, seed, res, ckpt, **extra) -> dict[str, Any]:
    row = {
        "variant": label,
        "kind": kind,
        "seed": seed,
        "train_len": cfg.model.train_len,
        "eval_len": res.n,
        "accuracy": res.accuracy,
        "loss": res.loss,
        "masked_tokens": res.masked,
        "windows": res.windows,
        "eval_tokens": res.tokens,
        "train_time_s": round(ckpt["train_time_s"], 2),
        "train_steps": ckpt["step"],
        "eval_time_s": round(res.seconds, 3),
        "status": "ok",
        "reason": "",
        "bits_per_byte": res.loss / math.log(2),
        **beyond(res, cfg.model.train_len),
        **extra,
        PIECES: (res.piece_masked, res.piece_correct),  # not a CSV column: pieces.csv
        POSITION_BINS: res.bins,  # not a CSV column: positions.csv
    }
    for i, h in enumerate(res.entropy):
        row[f"entropy_l{i}"] = h
    for i, m in enumerate(res.far_mass):
        row[f"far_mass_l{i}"] = m
    for i, sd in enumerate(res.score_std):
        row[f"score_std_l{i}"] = sd
    return row


def baseline_rows(cfg: ExtrapConfig, train: Tensor, stream: EvalStream) -> list[dict[str, Any]]:
    """The count floors (:mod:`attnbench.extrapolation.evaluation.floors`) at every evaluation
    length, on the same windows and masks as the models: ``count-baseline`` (the fair, mask-aware
    table, counted over the masked positions of the first seed's training batches),
    ``count-eval-masks`` (the same table counted on contexts masked at the evaluation rate, from
    as many examples; only when the rates differ) and ``count-backoff`` (the first rule); one
    row per floor and length, no seed. ``built_from`` is the number of masked examples each table
    was counted from. A ``clm`` run has one floor, the causal ``count-baseline``
    (:mod:`attnbench.extrapolation.evaluation.causal_floor`)."""
    if cfg.model.causal:
        return causal_floor_rows(cfg, train, stream)
    fair = baseline.MaskedContextCounts.from_training(
        train, cfg.train, cfg.model.train_len, cfg.run.seed_start
    )
    floors = [(baseline.LABEL, lambda: fair, baseline.describe())]
    eval_rate = cfg.eval_mask_prob
    if eval_rate != cfg.train.mask_prob or cfg.train.final_mask_prob:
        floors.append((
            baseline.EVAL_MASKS_LABEL,
            lambda: baseline.MaskedContextCounts.at_eval_rate(
                train, cfg.train, cfg.model.train_len, cfg.run.seed_start, eval_rate,
                fair.examples,
            ),
            baseline.describe_eval_masks(eval_rate),
        ))  # fmt: skip
    floors.append(
        (baseline.BACKOFF_LABEL, lambda: baseline.ContextCounts(train), baseline.describe_backoff())
    )
    return [row for label, build, note in floors for row in _floor_rows(cfg, stream, label,
                                                                       build, note)]  # fmt: skip


def _floor_rows(cfg: ExtrapConfig, stream: EvalStream, label: str, build, note: str) -> list[dict]:
    """One count table's row at every evaluation length."""
    started = time.perf_counter()
    counts = build()
    rows = []
    for n in cfg.eval.lengths:
        tokens, mask = stream.windows(n)
        correct, masked = counts.accuracy(tokens, mask)
        rows.append(
            {
                "variant": label,
                "kind": "baseline",
                "applied_to": "",
                "mechanism": "",
                "path": "",
                "params": "",
                "note": note,
                "seed": None,
                "train_len": cfg.model.train_len,
                "eval_len": n,
                "accuracy": 100.0 * correct / max(1, masked),
                "loss": None,  # a count table has no probabilities to score
                "masked_tokens": masked,
                "windows": tokens.shape[0],
                "eval_tokens": tokens.numel(),
                "eval_time_s": round(time.perf_counter() - started, 3),
                "status": "ok",
                "reason": "",
                "built_from": counts.examples,
            }
        )
    return rows


def causal_floor_rows(cfg: ExtrapConfig, train: Tensor, stream: EvalStream) -> list[dict]:
    """The causal ``count-baseline`` at every evaluation length, on the models' scored bytes."""
    started = time.perf_counter()
    counts = causal_floor.NextByteCounts.from_training(
        train, cfg.train, cfg.model.train_len, cfg.run.seed_start
    )
    rows = []
    for n in cfg.eval.lengths:
        tokens, mask = stream.windows(n)
        problem = make_targets(tokens, mask, stream.positions(n), causal=True)
        correct, scored = counts.accuracy(problem.inputs, problem.rows, problem.targets)
        rows.append(
            {
                "variant": baseline.LABEL, "kind": "baseline", "applied_to": "", "mechanism": "",
                "path": "", "params": "", "note": causal_floor.describe(), "seed": None,
                "train_len": cfg.model.train_len, "eval_len": n,
                "accuracy": 100.0 * correct / max(1, scored), "loss": None,
                "masked_tokens": scored, "windows": tokens.shape[0],
                "eval_tokens": tokens.numel(),
                "eval_time_s": round(time.perf_counter() - started, 3), "status": "ok",
                "reason": "", "built_from": counts.examples,
            }
        )  # fmt: skip
    return rows


def _failed_row(cfg, label, kind, seed, n, ckpt, reason, **extra) -> dict[str, Any]:
    return {
        "variant": label,
        "kind": kind,
        "seed": seed,
        "train_len": cfg.model.train_len,
        "eval_len": n,
        "train_time_s": round(ckpt["train_time_s"], 2),
        "train_steps": ckpt["step"],
        "status": "error",
        "reason": reason,
        **extra,
    }


def _eval_positions(cfg: ExtrapConfig, model: MLMEncoder) -> EvalPositions | None:
    """The evaluation positions of a model trained with randomized positions (see
    ``eval.positions_as_trained``), or None (0..n-1)."""
    span = cfg.train.random_positions
    if not (span and cfg.eval.positions_as_trained and model.takes_positions()):
        return None
    return EvalPositions(span, cfg.eval.seed)


def _eval_all(cfg, log, model, label, kind, seed, ckpt, stream, chunk=None, **extra):
    extra["model_params"] = model.num_params()
    positions = _eval_positions(cfg, model)
    if positions is not None:
        span = positions.span
        said = f"rotary positions: sorted random ids from 0..{span - 1} at n < {span}"
        extra["note"] = "; ".join(filter(None, [extra.get("note", ""), said]))
    rows = []
    for n in cfg.eval.lengths:
        try:
            res = evaluate(
                model,
                stream,
                n,
                chunk=chunk,
                batch_tokens=cfg.eval.batch_tokens,
                entropy_tokens=cfg.eval.entropy_tokens,
                positions=positions,
                causal=cfg.model.causal,
                train_len=cfg.model.train_len,
            )
        except (AttnbenchError, RuntimeError) as e:  # a mechanism that cannot run at this n
            reason = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
            log(f"{label} seed {seed} n={n}: {reason}")
            rows.append(_failed_row(cfg, label, kind, seed, n, ckpt, reason, **extra))
            continue
        rows.append(_row(cfg, label, kind, seed, res, ckpt, **extra))
        if cfg.eval.long_range:
            try:
                rows[-1][longrange_report.CELLS] = _long_range(
                    cfg, model, stream, n, chunk, positions
                )
            except (AttnbenchError, RuntimeError, ValueError) as e:  # the standard row stays
                log(f"{label} seed {seed} n={n}: long-range span failed: {type(e).__name__}: "
                    f"{str(e).splitlines()[0][:200]}")  # fmt: skip
    accs = " ".join(f"{r['accuracy']:.1f}" if r["status"] == "ok" else "err" for r in rows)
    log(f"  {label:<14} seed {seed}: accuracy {accs}")
    return rows


def _long_range(cfg: ExtrapConfig, model, stream: EvalStream, n: int, chunk: int | None, positions):
    """The long-range span at length n (:mod:`attnbench.extrapolation.evaluation.longrange`)."""
    tokens, mask = stream.windows(n)
    return longrange.evaluate_long_range(
        model,
        tokens,
        mask,
        seed=cfg.eval.seed,
        length=cfg.eval.copy_length,
        distances=cfg.eval.copy_distances,
        chunk=chunk,
        batch_tokens=cfg.eval.batch_tokens,
        positions=positions,
    )


def _evaluate_trained(cfg, log, v: TrainedVariant, seed, ckpt, stream, device) -> list[dict]:
    model = build_model(cfg.model, v.mixer)
    model.load_state_dict(ckpt["model"])
    model.to(device)
    return _eval_all(
        cfg,
        log,
        model,
        v.label,
        "trained",
        seed,
        ckpt,
        stream,
        applied_to="",
        mechanism=v.spec.mechanism,
        path=v.spec.path or "",
        params=spec_json(v.spec),
        note=row_note(position_of(cfg.model, v.mixer), cfg.model.causal),
        position=position_of(cfg.model, v.mixer),
    )


def _evaluate_eval_time(cfg, log, ev: EvalTimeVariant, seed, ckpt, stream, device) -> list[dict]:
    tricks = ev.tricks
    model = MLMEncoder(cfg.model, trick_mixers(tricks))
    model.load_state_dict(ckpt["model"])  # strict: the O weights, unchanged
    model.to(device)
    return _eval_all(
        cfg,
        log,
        model,
        ev.label,
        "eval-time",
        seed,
        ckpt,
        stream,
        chunk=cfg.model.train_len if tricks.chunk else None,
        applied_to=ev.base,
        mechanism="softmax",
        path="dense (eval-time)",
        params="",
        note=tricks.describe(),
        position="rope",
    )


@dataclass
class EvalTask:
    """One evaluation of the run (picklable, so a worker process can run it): a trained
    checkpoint, an eval-time row on a trained O checkpoint, or the count baseline."""

    cfg: ExtrapConfig
    kind: str  # "trained", "eval-time" or "baseline"
    variant: TrainedVariant | EvalTimeVariant | None
    seed: int | None
    path: Path | None  # the checkpoint
    device: str

    @classmethod
    def for_checkpoint(cls, cfg, v, seed, path, eval_rows, device) -> list[EvalTask]:
        """The trained variant's own evaluation, and on O every eval-time row."""
        tasks = [cls(cfg, "trained", v, seed, path, device)]
        if v.label == "O":
            tasks += [cls(cfg, "eval-time", ev, seed, path, device) for ev in eval_rows]
        return tasks

    def run(self, stream: EvalStream, train_stream: Tensor, log) -> list[dict[str, Any]]:
        if self.kind == "baseline":
            return baseline_rows(self.cfg, train_stream, stream)
        ckpt = load_checkpoint(self.path)
        evaluate_one = _evaluate_trained if self.kind == "trained" else _evaluate_eval_time
        device = torch.device(self.device)
        return evaluate_one(self.cfg, log, self.variant, self.seed, ckpt, stream, device)


def eval_task_count(plan: Plan, eval_rows) -> int:
    return 1 + sum(1 + (len(eval_rows) if v.label == "O" else 0) for v, *_ in plan.entries)


# --------------------------------------------------------------------------------------------
# The evaluations, here or as units of the runtime
# --------------------------------------------------------------------------------------------


def evaluate_tasks(
    tasks: Sequence[EvalTask],
    stream: EvalStream,
    train_stream: Tensor,
    layout: tuple[int, int],
    log: Callable[[str], None],
    take: Callable[[list[dict[str, Any]]], Any],
) -> None:
    """Each task's rows to ``take``, in the order of ``tasks``: here, or with ``layout`` =
    (processes, threads each) of two or more, as units of the runtime in that many long-lived
    worker processes at once (spawned; each gets the evaluation span and the training text
    once; a unit whose process dies is retried once in a fresh one). A failed evaluation raises
    here (the workers are stopped first); so does Ctrl-C."""
    workers, threads = layout
    workers = min(workers, len(tasks))
    if workers < 2:
        for task in tasks:
            take(task.run(stream, train_stream, log))
        return
    log(f"evaluating {len(tasks)} models, eval-time rows and baselines: {workers} at once, "
        f"{threads} thread{'s' * (threads > 1)} each")  # fmt: skip
    finished: dict[int, list[dict[str, Any]]] = {}
    given = 0

    def in_order(end: UnitEnd) -> None:
        nonlocal given
        if end.error is not None:
            raise end.error
        if not end.ok:
            raise AttnbenchError(f"evaluation {end.index + 1} of {len(tasks)}: {end.reason}")
        finished[end.index] = end.result
        while given in finished:
            take(finished.pop(given))
            given += 1

    work = Work(_evaluate_unit, (stream, train_stream, threads))
    run_units(tasks, work, Executor("local", at_once=workers, keep_workers=True), in_order,
              on_retry=lambda end: log(f"evaluation {end.index + 1}: {end.reason}; retrying "
                                       "once in a fresh process"))  # fmt: skip


def _evaluate_unit(task: EvalTask, attempt: int, stream: EvalStream, train_stream: Tensor,
                   threads: int) -> list[dict[str, Any]]:  # fmt: skip
    """A worker process's unit: one evaluation task's rows, with ``threads`` torch threads."""
    torch.set_num_threads(threads)
    return task.run(stream, train_stream, logs.info)
