"""``attnbench run extrapolate --sweep NAME``: a sweep of configurations, each candidate's run as
a unit (or ``--sweep-cost RxS``: their training steps timed side by side), then the table
(:mod:`attnbench.extrapolation.experiment.sweep`)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import typer

from attnbench.cli.common import err, fail, out
from attnbench.runtime.tomlconfig import PRESETS_DIR

#: The shipped sweep files' names (``suites/extrapolate/sweeps/*.toml``), for the help.
SHIPPED_SWEEPS = ", ".join(sorted(p.stem for p in (PRESETS_DIR / "sweeps").glob("*.toml")))

SweepOption = Annotated[
    str | None,
    typer.Option(
        help=f"Run a sweep of configurations instead of one run: a shipped sweep "
        f"({SHIPPED_SWEEPS}) or a TOML file. Each candidate's run goes to OUT/runs/NAME, "
        "run.parallel at once (--set applies to every candidate), then OUT/sweep.md."
    ),
]
SweepOnlyOption = Annotated[
    str | None, typer.Option(help="--sweep: only these candidates, comma-separated.")
]
SweepCostOption = Annotated[
    str | None,
    typer.Option(
        help="--sweep: time the candidates' training steps side by side instead of training "
        "them: RxS, R timed rounds of S steps after a warm-up round, one thread (OUT/cost.csv)."
    ),
]

#: What a sweep takes from the command line besides the sweep itself (everything else is the
#: sweep file's): parameter -> its value when not given.
SWEEP_TAKES = {"sweep": None, "sweep_only": None, "sweep_cost": None, "set_": None,
               "out_dir": None, "resume": False, "overwrite": False, "executor": "local",
               "ray_address": None}  # fmt: skip
#: Parameters whose defaults are not None/False (the others: given when truthy).
DEFAULTS = {"preset": "cpu"}


def run_sweep(params: Mapping[str, Any]) -> None:
    """``--sweep``: train (or time) the candidates, then write and print the table."""
    from attnbench.extrapolation.experiment import sweep as sweeps

    given = [
        f"--{name.rstrip('_').replace('_', '-')}"
        for name, value in params.items()
        if name not in SWEEP_TAKES and _given(value) and value != DEFAULTS.get(name)
    ]
    if given:
        raise fail(
            f"{', '.join(given)}: a sweep takes its settings from the sweep file; accepted "
            "beside --sweep: --sweep-only, --sweep-cost, --set (over every candidate), --out, "
            "--resume, --overwrite, --executor, --ray-address"
        )
    if params["resume"] and params["overwrite"]:
        raise fail("--resume and --overwrite exclude each other")
    sweep = sweeps.load_sweep(params["sweep"], params["set_"])
    only = [n.strip() for n in (params["sweep_only"] or "").split(",") if n.strip()]
    names = sweeps.chosen(sweep, only)
    target = params["out_dir"] or Path("runs") / "sweeps" / sweep.name
    target.mkdir(parents=True, exist_ok=True)
    log = _log
    if params["sweep_cost"] is not None:
        rounds, steps = sweeps.parse_cost(params["sweep_cost"])
        sweeps.measure_costs(sweep, target, names, rounds, steps, log)
        log(f"wrote {target / sweeps.COST_NAME}")
    else:
        sweeps.train_candidates(sweep, target, names, executor=params["executor"].value,
                                ray_address=params["ray_address"], resume=params["resume"],
                                overwrite=params["overwrite"], log=log)  # fmt: skip
    if not any((target / sweeps.RUNS_DIR / n / "extrapolate.csv").exists() for n in sweep.names):
        return  # costs only, no run yet: no table
    table = sweeps.write_table(sweep, target)
    out.print(table, markup=False, highlight=False, soft_wrap=True)
    err.print(f"wrote {target / (sweeps.TABLE_NAME + '.md')}", markup=False, highlight=False)


def _given(value: Any) -> bool:
    """Whether an option's value says it was given (not None, False or an empty list)."""
    if isinstance(value, (list, tuple)):
        return bool(value)
    return value is not None and value is not False


def _log(msg: str) -> None:
    err.print(msg, markup=False, highlight=False)
