"""A sweep of extrapolation configurations (``attnbench run extrapolate --sweep NAME``): what buys a
preset the most accuracy per CPU-minute.

A sweep file (TOML, shipped in ``suites/extrapolate/sweeps/`` or a path) names a preset, the
settings every candidate starts from (``base``, as ``--set`` takes them) and the candidates, each
a list of settings over the base; ``--set`` on the command line applies over every candidate.
Two measurements, kept apart because they need different conditions:

- **train** (the default): each candidate's run, ``attnbench run extrapolate`` with its settings
  into ``OUT/runs/NAME`` (its sidecar records that command, which makes it alone), as a unit of
  the runtime: ``run.parallel`` candidates at once on this machine (0: the cores / the threads a
  run takes), or one Ray task each. Accuracy does not depend on load, so these may run on a busy
  machine.
- **cost** (``--sweep-cost RxS``): the time of one training step of every candidate, measured
  side by side in this process on one thread, interleaved round by round (so load hits every
  candidate alike): one warm-up round, then R timed rounds of S steps; the median and the spread
  over the rounds, as a ratio to the first candidate (``step_ratio``), and times the steps
  (``cost_ratio``: what one training costs against the first candidate's). A candidate may time
  its step with its mixers and FFNs under ``torch.compile`` (``compile = true``); the file's
  ``[cost] profile`` also writes where the first candidate's step spends its time.

Either way the table is written again from what the folder holds: ``sweep.csv`` and
``sweep.md`` (accuracy at L of the first trained variant, the fair floor ``count-baseline`` of
the same run and the margin, the same table counted at the evaluation's masking rate
``count-eval-masks`` and the margin to it, the cost ratio, the training minutes).
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from attnbench.core.errors import AttnbenchError
from attnbench.extrapolation.evaluation.floors import EVAL_MASKS_LABEL as EVAL_MASKS_FLOOR
from attnbench.extrapolation.evaluation.floors import LABEL as FLOOR
from attnbench.extrapolation.experiment.config import ExtrapConfig, load_preset, resolve_variants
from attnbench.measure import machine
from attnbench.runtime import tomlconfig
from attnbench.runtime.execute import Executor, UnitEnd, Work, run_units
from attnbench.runtime.outputs import write_csv, write_text
from attnbench.runtime.schema import Checked, read_section, setting
from attnbench.runtime.tomlconfig import parse_settings

#: The shipped sweep files.
SWEEPS_DIR = tomlconfig.PRESETS_DIR / "sweeps"
RUNS_DIR = "runs"
COST_NAME = "cost.csv"
TABLE_NAME = "sweep"
PROFILE_NAME = "step-profile.txt"
#: Every candidate's run in one process (it trains one model): the sweep shares the cores out.
ONE_PROCESS = "run.parallel=1"


@dataclass(frozen=True)
class Candidate(Checked):
    """One candidate of a sweep: ``[candidates] NAME = { settings = [...] }``."""

    settings: tuple[str, ...] = setting((), "SECTION.FIELD=VALUE over the base, in order")
    compile: bool = setting(
        False, "cost: time the step with the mixers and FFNs under torch.compile"
    )


@dataclass(frozen=True)
class CostSettings(Checked):
    """How the step cost is measured; a sweep file's ``[cost]``."""

    profile: bool = setting(
        False, f"also write where the first candidate's step spends its time ({PROFILE_NAME})"
    )


@dataclass(frozen=True)
class SweepFile(Checked):
    """The keys of a sweep file."""

    description: str = setting("", "one line saying what the sweep looks for")
    preset: str = setting("cpu", "the preset every candidate starts from")
    base: tuple[str, ...] = setting(
        (), "settings every candidate starts from (SECTION.FIELD=VALUE, as --set takes them)"
    )
    unchanged: str = setting("(the base)", "what the table says of a candidate with no settings")
    candidates: dict[str, Candidate] = setting({}, "the candidates by name", non_empty=True)
    cost: CostSettings = setting(CostSettings, "how the step cost is measured")


@dataclass(frozen=True)
class Sweep:
    """A sweep file read, with the command line's ``--set`` over every candidate."""

    name: str
    file: SweepFile
    extra: tuple[str, ...] = ()

    @property
    def names(self) -> list[str]:
        return list(self.file.candidates)

    def settings(self, name: str) -> list[str]:
        """Candidate ``name``'s settings, in order: the base, its own, the command line's."""
        return [*self.file.base, *self.file.candidates[name].settings, *self.extra]

    def config(self, name: str) -> ExtrapConfig:
        """Candidate ``name``'s config (errors name the candidate and the setting)."""
        label = f"--sweep {self.name} [candidates.{name}]"
        return load_preset(self.file.preset, parse_settings(self.settings(name), label))

    def command(self, name: str, out: Path) -> list[str]:
        """The command that makes candidate ``name``'s run into ``out`` alone."""
        sets = [a for s in [*self.settings(name), ONE_PROCESS] for a in ("--set", s)]
        return ["attnbench", "run", "extrapolate", "--preset", self.file.preset, *sets,
                "--out", str(out)]  # fmt: skip


def find_sweep(name_or_path: str) -> Path:
    return tomlconfig.find_config(name_or_path, SWEEPS_DIR, "sweep")


def load_sweep(name_or_path: str, extra: list[str] | None = None) -> Sweep:
    """A sweep file, every candidate's config checked (a mistake shows before any work)."""
    text = tomlconfig.load(find_sweep(name_or_path), "sweep")
    sweep = Sweep(text.path.stem, read_section(text, text.data, SweepFile), tuple(extra or ()))
    for name in sweep.names:
        sweep.config(name)
    return sweep


def chosen(sweep: Sweep, only: list[str]) -> list[str]:
    """The candidates ``--sweep-only`` names (all when it names none), in the file's order."""
    unknown = [n for n in only if n not in sweep.file.candidates]
    if unknown:
        raise AttnbenchError(
            f"--sweep-only {','.join(unknown)}: not a candidate of {sweep.name}; accepted: "
            f"{', '.join(sweep.names)}"
        )
    return [n for n in sweep.names if not only or n in only]


# --------------------------------------------------------------------------------------------
# Train: each candidate's run as a unit of the runtime
# --------------------------------------------------------------------------------------------


def train_candidates(sweep: Sweep, out: Path, names: list[str], *, executor: str = "local",
                     ray_address: str | None = None, resume: bool = False,
                     overwrite: bool = False, log=print) -> None:  # fmt: skip
    """Each candidate of ``names`` run into ``OUT/runs/NAME``; a candidate whose run fails twice
    is reported once the others are done."""
    kept = [n for n in names if list((out / RUNS_DIR / n / "checkpoints").glob("*.pt"))]
    if kept and not (resume or overwrite):
        raise AttnbenchError(
            f"{out / RUNS_DIR} already holds checkpoints of {', '.join(kept[:3])}"
            f"{' ...' if len(kept) > 3 else ''}; pass --resume to continue them, or --overwrite "
            "to start over"
        )
    base = sweep.config(names[0])
    threads = base.run.threads or 1
    if executor == "ray":
        where = Executor("ray", ray_address=ray_address, resources={"num_cpus": threads})
    else:
        at_once = base.run.parallel or max(1, machine.usable_cores() // threads)
        where = Executor("local", at_once=min(at_once, len(names)))
        log(f"{len(names)} candidates of {sweep.name}: {where.at_once} at once, {threads} "
            f"thread{'s' * (threads > 1)} each, into {out / RUNS_DIR}")  # fmt: skip
    failures: list[str] = []

    def ended(end: UnitEnd) -> None:
        if end.ok:
            log(f"{end.tally()} {end.result}")
        else:
            failures.append(f"{end.job} ({end.reason})")
            log(f"{end.tally()} {end.job}: FAILED twice ({end.reason})")

    work = Work(_train_candidate, (sweep, out, resume, overwrite), unit_id=lambda n: f"sweep-{n}")
    run_units(names, work, where, ended, log=log,
              on_retry=lambda end: log(f"{end.job}: {end.reason}; retrying once"))  # fmt: skip
    if failures:
        raise AttnbenchError(f"{len(failures)} of {len(names)} candidates failed twice: "
                             f"{'; '.join(failures)}")  # fmt: skip


def _train_candidate(name: str, attempt: int, sweep: Sweep, out: Path, resume: bool,
                     overwrite: bool) -> str:  # fmt: skip
    """A worker's unit: candidate ``name``'s run (resumed from its checkpoint on the retry);
    returns a line saying how it did."""
    from attnbench.extrapolation.experiment.plan import RunOptions
    from attnbench.extrapolation.experiment.run import run_extrapolate
    from attnbench.runtime import logs
    from attnbench.runtime.progress import LogLines

    target = out / RUNS_DIR / name
    cfg = sweep.config(name).override({"run.parallel": 1})
    retry = attempt > 1  # continue from the checkpoint the first attempt wrote
    opts = RunOptions(out=target, resume=resume or retry, overwrite=overwrite and not retry,
                      argv=sweep.command(name, target), log=logs.info,
                      progress=lambda: LogLines(lines=10))  # fmt: skip
    target.mkdir(parents=True, exist_ok=True)
    result = run_extrapolate(cfg, opts)
    at = _at_training_length(pd.DataFrame(result.rows))
    strict = "" if at["eval_masks_floor"] is None else f", {at['eval_masks_floor']:.2f} at 15 %"
    return f"{name}: {at['model']} {at['accuracy']:.2f} at L, floor {at['floor']:.2f}{strict}"


def _at_training_length(df: pd.DataFrame) -> dict[str, Any]:
    """The first trained row's accuracy at n = L, the fair floor's (``count-baseline``) and,
    when the run counted it, the same table's counted at the evaluation's masking rate
    (``count-eval-masks``, None otherwise), of one run's rows."""
    at = df[df["eval_len"] == df["train_len"]]
    models = at[at["kind"] == "trained"]
    floors = at[at["variant"] == FLOOR]
    if models.empty or floors.empty:
        raise AttnbenchError(f"a candidate's run has no trained row or no {FLOOR} at n = L")
    strict = at[at["variant"] == EVAL_MASKS_FLOOR]["accuracy"]
    return {"model": models["variant"].iloc[0], "accuracy": float(models["accuracy"].iloc[0]),
            "floor": float(floors["accuracy"].iloc[0]),
            "eval_masks_floor": float(strict.iloc[0]) if len(strict) else None}  # fmt: skip


# --------------------------------------------------------------------------------------------
# Cost: the training step of every candidate, side by side
# --------------------------------------------------------------------------------------------


def parse_cost(text: str) -> tuple[int, int]:
    """``"4x3"`` -> (4 timed rounds, 3 steps each)."""
    rounds, sep, steps = text.lower().partition("x")
    if sep and rounds.isdigit() and steps.isdigit() and int(rounds) >= 1 and int(steps) >= 1:
        return int(rounds), int(steps)
    raise AttnbenchError(
        f"--sweep-cost {text!r}: accepted: RxS, R timed rounds of S steps (after one warm-up "
        "round), e.g. 4x3"
    )


def _stepper(cfg: ExtrapConfig, stream: torch.Tensor, compiled: bool):
    """One training step of ``cfg``'s first trained variant (seed 0), as a function."""
    from attnbench.extrapolation.model.encoder import build_model
    from attnbench.extrapolation.training.batches import TrainingBatches, masked_loss
    from attnbench.extrapolation.training.loop import make_optimizer

    torch.manual_seed(0)
    variants, _ = resolve_variants(cfg)
    model = build_model(cfg.model, variants[0].mixer)
    if compiled:  # fixed shapes in the mixers; the last FFN sees the N masked rows
        for block in model.blocks:
            block.mixer = torch.compile(block.mixer, dynamic=False)
            if block.ffn is not None:
                block.ffn = torch.compile(block.ffn, dynamic=True)
    opt = make_optimizer(model, cfg.train)
    batches = TrainingBatches(
        stream, cfg.train, cfg.model.train_len, seed=0, causal=cfg.model.causal
    )

    def step() -> None:
        loss = masked_loss(model, *batches.next()[:3])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def measure_costs(sweep: Sweep, out: Path, names: list[str], rounds: int, steps: int,
                  log=print) -> pd.DataFrame:  # fmt: skip
    """The step time of each candidate of ``names`` (the sweep's first one always, as the
    reference), interleaved round by round on one thread; written to ``cost.csv`` (rows measured
    again replace their old ones)."""
    from attnbench.data import load_corpus

    first = sweep.names[0]
    names = [first, *(n for n in names if n != first)]
    cfgs = {n: sweep.config(n) for n in names}
    corpus = load_corpus(cfgs[first].run.corpus or None)
    old_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        stream = corpus.split(cfgs[first].run.holdout).train
        steppers = {n: _stepper(cfgs[n], stream, sweep.file.candidates[n].compile) for n in names}
        log(f"timing the training step of {len(names)} candidates: one warm-up round, then "
            f"{rounds} round{'s' * (rounds > 1)} of {steps} step{'s' * (steps > 1)}, one "
            "thread")  # fmt: skip
        times = _interleaved(steppers, rounds, steps)
        if sweep.file.cost.profile:
            _profile(steppers[first], steps * 4, out / PROFILE_NAME, first)
    finally:
        torch.set_num_threads(old_threads)
    ref = statistics.median(times[first])
    rows = []
    for name in names:
        step = statistics.median(times[name])
        cfg = cfgs[name]
        rows.append({
            "candidate": name,
            "step_ms": round(1000 * step, 2),
            "step_ms_spread": round(1000 * (max(times[name]) - min(times[name])), 2),
            "step_ratio": round(step / ref, 3),
            "steps": cfg.train.steps,
            "cost_ratio": round(step / ref * cfg.train.steps / cfgs[first].train.steps, 3),
            "rounds": rounds,
            "steps_per_round": steps,
        })  # fmt: skip
    frame = pd.DataFrame(rows)
    path = out / COST_NAME
    if path.exists():  # measured again: the new rows replace the old ones
        old = pd.read_csv(path)
        frame = pd.concat([old[~old["candidate"].isin(frame["candidate"])], frame])
    write_csv(frame, path, index=False)
    return frame


def _interleaved(steppers: dict[str, Any], rounds: int, steps: int) -> dict[str, list[float]]:
    """Seconds per step of each stepper, round by round (the first round warms up, untimed)."""
    times: dict[str, list[float]] = {name: [] for name in steppers}
    for rnd in range(rounds + 1):
        for name, step in steppers.items():
            started = time.perf_counter()
            for _ in range(steps):
                step()
            if rnd:
                times[name].append((time.perf_counter() - started) / steps)
    return times


def _profile(step, count: int, path: Path, name: str) -> None:
    """Where ``count`` steps spend their CPU time: the top operators by self time."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(count):
            step()
    top = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15)
    write_text(path, f"{count} training steps of candidate {name}, one thread\n{top}\n")


# --------------------------------------------------------------------------------------------
# The table
# --------------------------------------------------------------------------------------------


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def write_table(sweep: Sweep, out: Path) -> str:
    """``sweep.csv`` and ``sweep.md`` from the runs and the costs ``out`` holds; returns the
    Markdown table."""
    costs = pd.read_csv(out / COST_NAME).set_index("candidate") if (out / COST_NAME).exists() \
        else pd.DataFrame()  # fmt: skip
    rows = []
    for name, candidate in sweep.file.candidates.items():
        run = out / RUNS_DIR / name
        if not (run / "extrapolate.csv").exists():
            continue
        at = _at_training_length(pd.read_csv(run / "extrapolate.csv"))
        sidecar = json.loads((run / "extrapolate.json").read_text(encoding="utf-8"))
        minutes = [t["train_time_s"] / 60 for t in sidecar.get("trainings", [])]
        rows.append({
            "candidate": name,
            "overrides": " ".join(candidate.settings) or sweep.file.unchanged,
            "accuracy_at_L": round(at["accuracy"], 2),
            "fair_floor_at_L": round(at["floor"], 2),
            "margin": round(at["accuracy"] - at["floor"], 2),
            "eval_masks_floor_at_L": _rounded(at["eval_masks_floor"]),
            "margin_eval_masks": _rounded(
                None if at["eval_masks_floor"] is None else at["accuracy"] - at["eval_masks_floor"]
            ),
            "cost_ratio": costs.loc[name, "cost_ratio"] if name in costs.index else None,
            "train_min_loaded": round(minutes[0], 1) if minutes else None,
        })  # fmt: skip
    if not rows:
        raise AttnbenchError(f"no candidate's run in {out / RUNS_DIR} yet: nothing to tabulate")
    frame = pd.DataFrame(rows)
    write_csv(frame, out / f"{TABLE_NAME}.csv", index=False)
    lines = ["| " + " | ".join(frame.columns) + " |", "|" + "---|" * len(frame.columns)]
    lines += ["| " + " | ".join(str(v) for v in r) + " |" for r in frame.itertuples(index=False)]
    text = "\n".join(lines) + "\n"
    write_text(out / f"{TABLE_NAME}.md", text)
    return text
