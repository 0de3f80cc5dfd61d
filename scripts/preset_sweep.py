"""What buys the `cpu` extrapolation preset the most accuracy per CPU-minute (issue 32).

Each candidate is a set of ``--set`` overrides of the `cpu` preset. Two measurements, kept apart
because they need different conditions:

* ``cost``: the time of one training step of every candidate, measured side by side in one
  process on one thread, interleaved round by round (so load hits every candidate alike), as a
  ratio to the first candidate. A candidate's training cost is its step ratio x its steps.
* ``train``: each candidate trained as seed 0 of O by ``attnbench run extrapolate`` (one thread,
  ``--jobs`` at once) and evaluated at the training length on the table's masks; the run also
  writes the fair count floor counted from that candidate's own training batches. Accuracy does
  not depend on load, so these may run on a busy machine.

``table`` joins both into ``sweep.csv`` and ``sweep.md`` under ``--out``::

    python scripts/preset_sweep.py cost --out results/extrapolate/preset-sweep
    python scripts/preset_sweep.py train --out results/extrapolate/preset-sweep --jobs 2
    python scripts/preset_sweep.py table --out results/extrapolate/preset-sweep

``compiled`` times the chosen preset's step eager and with torch.compile (interleaved, one
thread) and profiles the eager step: ``compiled.csv`` and ``step-profile.txt``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import torch

#: The `cpu` preset as it was when the sweep ran (until 2026-11-25; the sweep chose today's):
#: every candidate starts from it, so that the commands stay what they were (the GELU FFN of
#: every candidate but the SwiGLU one, the preset's FFN since 2026-11-28).
PRESET_AS_IT_WAS: dict[str, str] = {
    "model.ffn": "gelu",
    "model.heads": "2",
    "model.ffn_mult": "4",
    "train.batch": "64",
    "train.steps": "3000",
    "train.mask_prob": "0.15",
    "eval.mask_prob": "0",
}

#: Shared by the later candidates: 8 heads and 40 % training masks (15 % at evaluation) ...
H8_MASK40: dict[str, str] = {"model.heads": "8", "train.mask_prob": "0.4", "eval.mask_prob": "0.15"}
#: ... in batches of 32 ...
H8_MASK40_B32: dict[str, str] = {**H8_MASK40, "train.batch": "32"}
#: ... with a feed-forward block of 2 x d_model, 9600 steps (the chosen preset).
H8_MASK40_B32_FFN2: dict[str, str] = {**H8_MASK40_B32, "model.ffn_mult": "2", "train.steps": "9600"}

#: name -> overrides of the preset as it was. "base" is that preset (the old table's).
CANDIDATES: dict[str, dict[str, str]] = {
    "base": {},
    "lr3e-3": {"train.lr": "3e-3"},
    "4layers": {"model.layers": "4", "train.steps": "1700"},
    "d192": {"model.d_model": "192", "model.heads": "3", "train.steps": "2000"},
    "d256": {"model.d_model": "256", "model.heads": "4", "train.steps": "1200"},
    "mask0.25": {"train.mask_prob": "0.25", "eval.mask_prob": "0.15"},
    "mask0.3": {"train.mask_prob": "0.3", "eval.mask_prob": "0.15"},
    "mask0.4": {"train.mask_prob": "0.4", "eval.mask_prob": "0.15"},
    "heads4": {"model.heads": "4"},
    "heads8": {"model.heads": "8"},
    "heads4-mask0.4": {**H8_MASK40, "model.heads": "4"},
    "heads8-mask0.4": H8_MASK40,
    "heads16": {"model.heads": "16"},
    "heads8-3layers": {"model.heads": "8", "model.layers": "3", "train.steps": "2400"},
    "heads8-mask0.5": {**H8_MASK40, "train.mask_prob": "0.5"},
    "heads8-mask0.4-b32": {**H8_MASK40_B32, "train.steps": "6000"},
    "heads8-mask0.4-b32-7800": {**H8_MASK40_B32, "train.steps": "7800"},
    "heads8-mask0.5-b32": {**H8_MASK40_B32, "train.mask_prob": "0.5", "train.steps": "6000"},
    "heads8-mask0.4-b16": {**H8_MASK40, "train.batch": "16", "train.steps": "12000"},
    "heads8-mask0.4-3900": {**H8_MASK40, "train.steps": "3900"},
    # A narrower feed-forward block (4x -> 2x, 1x) frees step time for more updates.
    "h8-m0.4-b32-ffn2-9600": H8_MASK40_B32_FFN2,
    "h8-m0.4-b32-ffn1-12000": {**H8_MASK40_B32, "model.ffn_mult": "1", "train.steps": "12000"},
    "h8-m0.45-b32-ffn2-9600": {**H8_MASK40_B32_FFN2, "train.mask_prob": "0.45"},
    # The learning rate and weight decay at the ffn2 shape (lr 3e-3 hurt the 2-head model).
    "h8-m0.4-b32-ffn2-9600-lr2e-3": {**H8_MASK40_B32_FFN2, "train.lr": "2e-3"},
    "h8-m0.4-b32-ffn2-9600-lr1.5e-3": {**H8_MASK40_B32_FFN2, "train.lr": "1.5e-3"},
    "h8-m0.4-b32-ffn2-9600-wd0.1": {**H8_MASK40_B32_FFN2, "train.weight_decay": "0.1"},
    # The end of training (the chosen preset's shape): a closing phase at the evaluation's 15 %
    # masks, and the cosine down to 0 instead of 0.1 lr.
    "ffn2-9600-final0.15x1200": {
        **H8_MASK40_B32_FFN2,
        "train.final_mask_prob": "0.15",
        "train.final_mask_steps": "1200",
    },
    "ffn2-9600-minlr0": {**H8_MASK40_B32_FFN2, "train.min_lr_ratio": "0"},
    # The FFN gated (SwiGLU at 2/3 of the width, about the same parameters and step).
    "ffn2-9600-swiglu": {**H8_MASK40_B32_FFN2, "model.ffn": "swiglu"},
}


def _config(overrides: dict[str, str]):
    from attnbench.extrapolation.experiment.config import load_preset

    return load_preset("cpu").override(PRESET_AS_IT_WAS | overrides)


def cost(args) -> None:
    """Median step time per candidate, interleaved, one thread."""
    from attnbench.extrapolation.experiment.config import VARIANTS
    from attnbench.extrapolation.experiment.plan import RunOptions, read_inputs
    from attnbench.extrapolation.model.encoder import build_model
    from attnbench.extrapolation.training.batches import BatchSampler, masked_loss
    from attnbench.extrapolation.training.loop import make_optimizer

    torch.set_num_threads(1)
    base = _config({})
    stream = read_inputs(base, RunOptions(out=args.out, log=lambda m: None)).split.train
    setups = {}
    names = [n for n in CANDIDATES if not args.only or n == "base" or n in args.only]
    for name in names:
        cfg = _config(CANDIDATES[name])
        torch.manual_seed(0)
        model = build_model(cfg.model, VARIANTS["O"])
        sampler = BatchSampler(stream, cfg.model.train_len, cfg.train.batch, cfg.train.mask_prob, 0)
        setups[name] = (model, make_optimizer(model, cfg.train), sampler, cfg)
    times: dict[str, list[float]] = {name: [] for name in setups}
    for rnd in range(args.rounds):
        for name, (model, opt, sampler, _) in setups.items():
            started = time.perf_counter()
            for _ in range(args.steps):
                loss = masked_loss(model, *sampler.next())
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
            if rnd:  # the first round warms up
                times[name].append((time.perf_counter() - started) / args.steps)
    ref = statistics.median(times["base"])
    rows = []
    for name, (_, _, _, cfg) in setups.items():
        step = statistics.median(times[name])
        rows.append(
            {
                "candidate": name,
                "step_ms": round(1000 * step, 2),
                "step_ms_spread": round(1000 * (max(times[name]) - min(times[name])), 2),
                "step_ratio": round(step / ref, 3),
                "steps": cfg.train.steps,
                "cost_ratio": round(step / ref * cfg.train.steps / base.train.steps, 3),
            }
        )
    frame = pd.DataFrame(rows)
    path = args.out / "cost.csv"
    if args.only and path.exists():  # re-measured rows replace their old ones
        old = pd.read_csv(path)
        frame = pd.concat([old[~old["candidate"].isin(frame["candidate"])], frame])
    frame.to_csv(path, index=False)
    print(frame.to_string(index=False))


def compiled(args) -> None:
    """The chosen preset's training step eager and with its mixers and FFNs under torch.compile,
    interleaved, one thread (``compiled.csv``), and where the eager step spends its time (the
    top operators by self CPU time, ``step-profile.txt``): is a compiled step a way to buy steps
    at the same CPU time?"""
    from torch.profiler import ProfilerActivity, profile

    from attnbench.extrapolation.experiment.config import VARIANTS, load_preset
    from attnbench.extrapolation.experiment.plan import RunOptions, read_inputs
    from attnbench.extrapolation.model.encoder import build_model
    from attnbench.extrapolation.training.batches import TrainingBatches, masked_loss
    from attnbench.extrapolation.training.loop import make_optimizer

    torch.set_num_threads(1)
    cfg = load_preset("cpu")
    stream = read_inputs(cfg, RunOptions(out=args.out, log=lambda m: None)).split.train

    def stepper(compile_parts: bool):
        torch.manual_seed(0)
        model = build_model(cfg.model, VARIANTS["O"])
        if compile_parts:  # fixed shapes in the mixers; the last FFN sees N masked rows
            for block in model.blocks:
                block.mixer = torch.compile(block.mixer, dynamic=False)
                if block.ffn is not None:
                    block.ffn = torch.compile(block.ffn, dynamic=True)
        opt = make_optimizer(model, cfg.train)
        batches = TrainingBatches(stream, cfg.train, cfg.model.train_len, seed=0)

        def step() -> None:
            loss = masked_loss(model, *batches.next())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

        return step

    arms = {"eager": stepper(False), "compiled": stepper(True)}
    for step in arms.values():  # warm-up: compiles the second arm
        for _ in range(args.steps):
            step()
    times: dict[str, list[float]] = {name: [] for name in arms}
    for _ in range(args.rounds):
        for name, step in arms.items():
            started = time.perf_counter()
            for _ in range(args.steps):
                step()
            times[name].append((time.perf_counter() - started) / args.steps)
    ref = statistics.median(times["eager"])
    frame = pd.DataFrame(
        [
            {
                "arm": name,
                "step_ms": round(1000 * statistics.median(t), 2),
                "step_ms_spread": round(1000 * (max(t) - min(t)), 2),
                "ratio_to_eager": round(statistics.median(t) / ref, 3),
                "rounds": len(t),
                "steps_per_round": args.steps,
            }
            for name, t in times.items()
        ]
    )
    frame.to_csv(args.out / "compiled.csv", index=False)
    print(frame.to_string(index=False))
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(args.steps * 4):
            arms["eager"]()
    top = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15)
    (args.out / "step-profile.txt").write_text(
        f"{args.steps * 4} eager training steps of the cpu preset, one thread\n{top}\n"
    )
    print(top)


def _command(name: str, overrides: dict[str, str], out: Path) -> list[str]:
    cmd = [sys.executable, "-m", "attnbench", "run", "extrapolate", "--variants", "O"]
    cmd += ["--eval-time", "none", "--threads", "1", "--out", str(out / "runs" / name)]
    cmd += ["--resume", "--set", "eval.lengths=64"]
    for key, value in (PRESET_AS_IT_WAS | overrides).items():
        cmd += ["--set", f"{key}={value}"]
    return cmd


def train(args) -> None:
    """Train the candidates, ``--jobs`` at once (each on one thread)."""
    todo = [n for n in CANDIDATES if not args.only or n in args.only]
    running: list[tuple[str, subprocess.Popen]] = []
    while todo or running:
        while todo and len(running) < args.jobs:
            name = todo.pop(0)
            log = open(args.out / f"{name}.log", "w")  # noqa: SIM115 (closed with the process)
            cmd = _command(name, CANDIDATES[name], args.out)
            print("start", name, " ".join(cmd[1:]), flush=True)
            running.append((name, subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)))
        time.sleep(5)
        for name, proc in list(running):
            if proc.poll() is not None:
                print("done", name, "exit", proc.returncode, flush=True)
                running.remove((name, proc))


def table(args) -> None:
    """sweep.csv / sweep.md: accuracy, floor and cost per candidate."""
    costs = pd.read_csv(args.out / "cost.csv").set_index("candidate")
    rows = []
    for name, over in CANDIDATES.items():
        csv = args.out / "runs" / name / "extrapolate.csv"
        if not csv.exists():
            continue
        df = pd.read_csv(csv)
        at = df[df["eval_len"] == df["train_len"]]
        model = at[at["variant"] == "O"]["accuracy"].iloc[0]
        floor = at[at["variant"] == "count-baseline"]["accuracy"].iloc[0]
        sidecar = json.loads((args.out / "runs" / name / "extrapolate.json").read_text())
        minutes = [t["train_time_s"] / 60 for t in sidecar.get("trainings", [])]
        rows.append(
            {
                "candidate": name,
                "overrides": " ".join(f"{k}={v}" for k, v in over.items()) or "(preset as was)",
                "accuracy_at_L": round(model, 2),
                "fair_floor_at_L": round(floor, 2),
                "margin": round(model - floor, 2),
                "cost_ratio": costs.loc[name, "cost_ratio"] if name in costs.index else None,
                "train_min_loaded": round(minutes[0], 1) if minutes else None,
            }
        )
    frame = pd.DataFrame(rows)
    frame.to_csv(args.out / "sweep.csv", index=False)
    lines = ["| " + " | ".join(frame.columns) + " |", "|" + "---|" * len(frame.columns)]
    lines += ["| " + " | ".join(str(v) for v in r) + " |" for r in frame.itertuples(index=False)]
    (args.out / "sweep.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=["cost", "train", "table", "compiled"])
    parser.add_argument("--out", type=Path, default=Path("runs/preset-sweep"))
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--only", nargs="*", default=[])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    {"cost": cost, "train": train, "table": table, "compiled": compiled}[args.what](args)


if __name__ == "__main__":
    main()
