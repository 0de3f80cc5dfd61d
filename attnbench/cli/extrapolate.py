"""``attnbench run extrapolate`` and ``attnbench run entropy`` (Su 2021)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from attnbench.cli.common import Choice, err, fail, out, parse_params
from attnbench.cli.extrapolate_sweep import (
    SweepCostOption,
    SweepOnlyOption,
    SweepOption,
    run_sweep,
)
from attnbench.core.errors import AttnbenchError
from attnbench.runtime.interrupts import Stopped

if TYPE_CHECKING:  # torch and the library are imported inside the commands (fast --help)
    from attnbench.extrapolation.experiment.config import ExtrapConfig
    from attnbench.extrapolation.experiment.plan import RunOptions


class Executor(Choice):
    """``--executor``: where the trainings run (``attnbench.runtime.engines.EXECUTORS``)."""

    local = "local"
    ray = "ray"


# --------------------------------------------------------------------------------------------
# The options of `run extrapolate` (and `run entropy`)
# --------------------------------------------------------------------------------------------

Preset = Annotated[
    str,
    typer.Option(
        "--preset",
        "-p",
        help="Preset name (cpu, cpu-positions, paper: the files in suites/extrapolate) or a TOML "
        "file.",
    ),
]
SeedsOption = Annotated[int | None, typer.Option(help="Training seeds (0..N-1), from 1 to 10000.")]
SeedStartOption = Annotated[int | None, typer.Option(help="First seed, >= 0 (below 2^63).")]
VariantsOption = Annotated[
    str | None,
    typer.Option(
        help="Trained variants, comma-separated: O, E, E-ln, preset \\[variants] tables or "
        "registry names."
    ),
]
ImplOption = Annotated[
    list[str] | None,
    typer.Option(
        help="Also train this registry mechanism (NAME or NAME:PATH; 'all': every "
        "bidirectional one). Repeatable."
    ),
]
ParamOption = Annotated[
    list[str] | None,
    typer.Option(help="NAME=VALUE parameter for the --impl mechanisms. Repeatable."),
]
EvalTimeOption = Annotated[
    str | None,
    typer.Option(
        help="Eval-time rows on the trained O, comma-separated (logn, logn^P, temperature, "
        "yarn, yarn-dim, local, chunk, ntk, pi, rerope, leaky, hwfa; compose with +, e.g. "
        "rerope+logn; rerope@W / leaky@W: this row's window W, e.g. rerope@48+logn; 'none')."
    ),
]
CorpusOption = Annotated[
    Path | None,
    typer.Option(help="A text file or a folder of .txt files (default: the shipped Shakespeare)."),
]
OutOption = Annotated[
    Path | None,
    typer.Option("--out", help="Output folder (default: a PRESET folder in runs/extrapolate)."),
]
CheckpointsOption = Annotated[
    Path | None, typer.Option(help="Checkpoint folder (default OUT/checkpoints).")
]
ResumeOption = Annotated[bool, typer.Option(help="Continue the checkpoints in the folder.")]
EvalOnlyOption = Annotated[
    bool, typer.Option(help="Only re-evaluate finished checkpoints (no training).")
]
FloorsOnlyOption = Annotated[
    bool,
    typer.Option(
        help="Count the floors of the finished run in --out again (today's count rows, on its "
        "windows and masks; its model rows kept): give the options of the command that made it."
    ),
]
TrainOnlyOption = Annotated[
    bool,
    typer.Option(
        help="Train (or with --resume continue) the checkpoints and stop; evaluate later "
        "with --eval-only. The one mode torchrun may start (data-parallel training)."
    ),
]
OverwriteOption = Annotated[
    bool, typer.Option(help="Retrain even if checkpoints exist; replace the results in --out.")
]
KeepWeightsOption = Annotated[
    str | None,
    typer.Option(
        help="Also keep these variants' trained weights in float16 in OUT/weights "
        "(comma-separated, e.g. O): small enough to commit, loadable with --eval-only."
    ),
]
#: The sizes a training step's memory grows with: a value this machine cannot hold is refused.
MEMORY = "as this machine's memory allows"
DModelOption = Annotated[int | None, typer.Option(help=f"Model width, >= 1, {MEMORY}.")]
LayersOption = Annotated[int | None, typer.Option(help=f"Blocks, >= 1, {MEMORY}.")]
HeadsOption = Annotated[int | None, typer.Option(help="Attention heads, >= 1.")]
FfnMultOption = Annotated[int | None, typer.Option(help=f"FFN width / d_model, >= 1, {MEMORY}.")]
TrainLenOption = Annotated[int | None, typer.Option(help=f"Training length L, >= 1, {MEMORY}.")]
BatchOption = Annotated[
    int | None, typer.Option(help=f"Windows per training step, >= 1, {MEMORY}.")
]
StepsOption = Annotated[int | None, typer.Option(help="Training steps, >= 1.")]
LrOption = Annotated[float | None, typer.Option(help="Peak learning rate (AdamW), > 0 and <= 1.")]
WarmupOption = Annotated[int | None, typer.Option(help="Warm-up steps, >= 0.")]
MaskProbOption = Annotated[float | None, typer.Option(help="Masking probability, in (0, 1).")]
EvalLengthsOption = Annotated[
    str | None, typer.Option(help="Evaluation lengths, comma-separated, each >= 1.")
]
EvalTokensOption = Annotated[
    int | None,
    typer.Option(help="Held-out tokens evaluated at every length (windows of n), >= 1."),
]
ThreadsOption = Annotated[
    int | None, typer.Option(help="CPU threads, >= 0 (0: all), at most this machine's cores.")
]
#: Not a fixed choice: cuda:N names any GPU (checked by the config, with the accepted forms).
DeviceOption = Annotated[
    str | None, typer.Option(help="auto (a GPU when there is one), cpu, cuda, cuda:N.")
]
CkptEveryOption = Annotated[
    int | None, typer.Option(help="Steps between checkpoints, >= 0 (0: the last alone).")
]
SetOption = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        help="Any preset setting as SECTION.FIELD=VALUE, over the preset before it is checked; "
        "sections: model, train, eval, run (e.g. train.lr=3e-4, run.variants=O,E). Repeatable; "
        "wins over the options above.",
    ),
]
TensorboardOption = Annotated[
    Path | None,
    typer.Option(
        help="Also log the training curves to TensorBoard in this folder (needs "
        "pip install tensorboard; curves.csv is written either way)."
    ),
]
ExecutorOption = Annotated[
    Executor,
    typer.Option(
        help="Where the trainings run: local (worker processes here) or ray (a Ray task "
        'each; pip install "attnbench\\[ray]").'
    ),
]
RayAddressOption = Annotated[
    str | None,
    typer.Option(help="--executor ray: the cluster to join (default: start a local Ray)."),
]
ShardOption = Annotated[
    str | None,
    typer.Option(
        help="I/N: train only trainings I, I+N, ... (an array job's task; implies "
        "--train-only); then --eval-only evaluates them all."
    ),
]
ListUnitsOption = Annotated[
    bool,
    typer.Option("--list-units", help="Print the run's units as JSON (trainings, evaluation)."),
]

#: The options that each set one config field: parameter -> SECTION.FIELD. Each becomes a
#: setting like --set's (merged over the preset before it is checked, an error naming the
#: option); every field, these included, can also be set with --set, which wins.
CONFIG_FIELDS = {
    "seeds": "run.seeds",
    "seed_start": "run.seed_start",
    "variants": "run.variants",
    "eval_time": "run.eval_time",
    "corpus": "run.corpus",
    "threads": "run.threads",
    "device": "run.device",
    "ckpt_every": "run.ckpt_every",
    "d_model": "model.d_model",
    "layers": "model.layers",
    "heads": "model.heads",
    "ffn_mult": "model.ffn_mult",
    "train_len": "model.train_len",
    "batch": "train.batch",
    "steps": "train.steps",
    "lr": "train.lr",
    "warmup": "train.warmup",
    "mask_prob": "train.mask_prob",
    "eval_lengths": "eval.lengths",
    "eval_tokens": "eval.tokens",
}


def config_overrides(params: Mapping[str, Any]) -> dict[str, object]:
    """The config options that were given (not None), as {"SECTION.FIELD": value}."""
    values = {CONFIG_FIELDS[name]: params[name] for name in CONFIG_FIELDS}
    if values["run.corpus"] is not None:
        values["run.corpus"] = str(values["run.corpus"])
    return {field: value for field, value in values.items() if value is not None}


def extrapolate(
    ctx: typer.Context,
    preset: Preset = "cpu",
    seeds: SeedsOption = None,
    seed_start: SeedStartOption = None,
    variants: VariantsOption = None,
    impl: ImplOption = None,
    param: ParamOption = None,
    eval_time: EvalTimeOption = None,
    corpus: CorpusOption = None,
    out_dir: OutOption = None,
    checkpoints: CheckpointsOption = None,
    resume: ResumeOption = False,
    eval_only: EvalOnlyOption = False,
    floors_only: FloorsOnlyOption = False,
    train_only: TrainOnlyOption = False,
    overwrite: OverwriteOption = False,
    keep_weights: KeepWeightsOption = None,
    d_model: DModelOption = None,
    layers: LayersOption = None,
    heads: HeadsOption = None,
    ffn_mult: FfnMultOption = None,
    train_len: TrainLenOption = None,
    batch: BatchOption = None,
    steps: StepsOption = None,
    lr: LrOption = None,
    warmup: WarmupOption = None,
    mask_prob: MaskProbOption = None,
    eval_lengths: EvalLengthsOption = None,
    eval_tokens: EvalTokensOption = None,
    threads: ThreadsOption = None,
    device: DeviceOption = None,
    ckpt_every: CkptEveryOption = None,
    set_: SetOption = None,
    tensorboard: TensorboardOption = None,
    executor: ExecutorOption = Executor.local,
    ray_address: RayAddressOption = None,
    shard: ShardOption = None,
    list_units: ListUnitsOption = False,
    sweep: SweepOption = None,
    sweep_only: SweepOnlyOption = None,
    sweep_cost: SweepCostOption = None,
) -> None:
    """Train a byte-level MLM encoder at one length and measure accuracy at longer ones.

    Su 2021: Attention-O vs Attention-E (log_512 n), registry mechanisms, eval-time tricks.

    Writes extrapolate.csv, extrapolate.json, table.md and accuracy_vs_length.png to --out.

    Checkpoints per (variant, seed): --resume, --eval-only, --train-only; Ctrl-C saves one.

    Several GPUs: torchrun --nproc_per_node G -m attnbench run extrapolate --train-only ...

    A sweep of configurations: --sweep NAME (each candidate's run, then a table).

    Example: [bold]attnbench run extrapolate --seeds 3 --impl local --out results/x[/bold]
    """
    if sweep is not None:
        run_sweep(ctx.params)
        return
    if sweep_only is not None or sweep_cost is not None:
        raise fail("--sweep-only and --sweep-cost go with --sweep NAME")

    if tensorboard is not None:
        from attnbench.extrapolation.training.curves import require_tensorboard

        require_tensorboard()
    # The options of CONFIG_FIELDS reach the config through ctx.params (every parameter's value).
    cfg = _config(preset, ctx.params, set_)
    if sum((resume, eval_only, overwrite)) > 1:
        raise fail("--resume, --eval-only and --overwrite exclude each other")
    opts = _run_options(cfg, ctx.params)
    if list_units:
        _print_units(cfg, opts)
    elif floors_only:
        _floors_only(cfg, opts, ctx.params)
    else:
        _run(cfg, opts)


def _floors_only(cfg: ExtrapConfig, opts: RunOptions, params: Mapping[str, Any]) -> None:
    """--floors-only: the run in --out gets today's count rows (no training, no model)."""
    from attnbench.extrapolation.experiment.recount import recount_floors

    clash = [f"--{k.replace('_', '-')}" for k in ("resume", "eval_only", "train_only", "overwrite")
             if params[k]]  # fmt: skip
    if clash or params["out_dir"] is None:
        raise fail(
            "--floors-only takes the --out folder of a finished run and the options of its "
            f"command, not {', '.join(clash) or 'no --out'}"
        )
    out.print(recount_floors(cfg, opts), markup=False, highlight=False)
    err.print(f"wrote {opts.out}", markup=False, highlight=False)


def _run(cfg: ExtrapConfig, opts: RunOptions) -> None:
    """The run, its table printed (none after --train-only: its last line said where the
    checkpoints are); Ctrl-C during a training said as every interrupt is."""
    from attnbench.extrapolation.experiment.run import run_extrapolate
    from attnbench.extrapolation.training.loop import Interrupted

    _refuse_to_replace(opts)
    try:
        result = run_extrapolate(cfg, opts)
    except Interrupted as e:  # said as every interrupt is (Group)
        raise Stopped(
            f"at step {e.step}/{e.total}", f"checkpoint {e.path}; continue with --resume"
        ) from None
    if opts.train_only:
        return
    out.print(result.table, markup=False, highlight=False)
    err.print(f"wrote {result.out}", markup=False, highlight=False)


def _config(preset: str, params: Mapping[str, Any], settings: list[str] | None) -> ExtrapConfig:
    """The preset, with the config options given and then every --set SECTION.FIELD=VALUE
    merged over it, then checked (an error names the option that set the value)."""
    from attnbench.extrapolation.experiment.config import load_preset
    from attnbench.runtime.tomlconfig import Setting, parse_settings

    options = {field: name for name, field in CONFIG_FIELDS.items()}
    given = [
        Setting(tuple(field.split(".")), value, f"--{options[field].replace('_', '-')} {value}")
        for field, value in config_overrides(params).items()
    ]
    return load_preset(preset, given + parse_settings(settings, "--set", "train.steps=500"))


def _refuse_to_replace(opts: RunOptions) -> None:
    """A run that trains afresh (no --resume, --eval-only or --train-only) into an --out that
    holds another run's results: refused unless --overwrite. A resumed or re-evaluated run
    writes its own results again."""
    from attnbench.extrapolation.experiment.results import CSV_NAME, SIDECAR_NAME, TABLE_NAME
    from attnbench.runtime.outputs import refuse_to_replace

    if opts.resume or opts.eval_only or opts.train_only:
        return
    refuse_to_replace(
        [opts.out / name for name in (CSV_NAME, SIDECAR_NAME, TABLE_NAME)],
        option="--out", folder=opts.out, overwrite=opts.overwrite,
        instead=" (and retrain), --resume to continue the run that wrote them, or --eval-only "
        "to evaluate its checkpoints again",
    )  # fmt: skip


def _run_options(cfg: ExtrapConfig, params: Mapping[str, Any]) -> RunOptions:
    """How to run (everything that is not the config): a RunOptions from the command's
    parameters (``--shard`` implies ``--train-only``)."""
    from attnbench.cli.progress import default_progress
    from attnbench.extrapolation.experiment.plan import RunOptions
    from attnbench.runtime.engines import parse_shard

    shard = parse_shard(params["shard"]) if params["shard"] is not None else None
    return RunOptions(
        out=params["out_dir"] or Path("runs") / "extrapolate" / cfg.preset,
        checkpoints=params["checkpoints"],
        resume=params["resume"],
        eval_only=params["eval_only"],
        train_only=params["train_only"] or shard is not None,
        overwrite=params["overwrite"],
        keep_weights=[v.strip() for v in (params["keep_weights"] or "").split(",") if v.strip()],
        impls=list(params["impl"] or []),
        impl_params=parse_params(params["param"]),
        log=lambda msg: err.print(msg, markup=False, highlight=False),
        progress=default_progress,
        tensorboard=params["tensorboard"],
        executor=Executor(params["executor"]).value,
        ray_address=params["ray_address"],
        shard=shard,
    )


def _print_units(cfg: ExtrapConfig, opts: RunOptions) -> None:
    """``--list-units``: the run's units as JSON on stdout."""
    from attnbench.extrapolation.experiment.plan import list_units

    opts.check()
    typer.echo(json.dumps([u.as_dict(opts.shard) for u in list_units(cfg, opts)], indent=1))


def entropy(
    preset: Preset = "cpu",
    out_dir: Annotated[
        Path | None, typer.Option("--out", help="Output folder (default runs/entropy/PRESET).")
    ] = None,
    checkpoints: Annotated[
        Path | None,
        typer.Option(
            help="Checkpoints of `run extrapolate` (default "
            "runs/extrapolate/PRESET/checkpoints); the trained part is skipped when none exist."
        ),
    ] = None,
    min_n: Annotated[int, typer.Option(help="Shortest length (power of 2 steps), >= 2.")] = 16,
    max_n: Annotated[
        int,
        typer.Option(help="Longest length, >= 2 and >= --min-n, as this machine's memory allows."),
    ] = 4096,
    dim: Annotated[int, typer.Option(help="Head dim d of the random q, k, >= 2.")] = 64,
    queries: Annotated[int, typer.Option(help="Random queries per length and trial, >= 1.")] = 256,
    trials: Annotated[int, typer.Option(help="Random draws per length, >= 1.")] = 4,
    seed: Annotated[int, typer.Option(help="Seed of the random q, k, 0 to 2^63-1.")] = 0,
    corpus: Annotated[
        Path | None, typer.Option(help="Text for the trained models (default: as trained).")
    ] = None,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Replace the entropy files already in --out.")
    ] = False,
) -> None:
    """Entropy of attention rows as n grows, for Attention-O and Attention-E.

    (a) random q, k of norm sqrt(d); (b) inside the trained models, when checkpoints exist.

    Fits H = log n - c*lambda*d + b (Su 2021: c about 0.24) and reports dH/dlog n.

    Writes entropy.csv, entropy.json and entropy.png (an earlier run's in --out: with
    --overwrite).

    Example: [bold]attnbench run entropy --max-n 1024[/bold]
    """
    from attnbench.extrapolation.analysis.entropy import EntropyOptions
    from attnbench.extrapolation.experiment.config import load_preset
    from attnbench.extrapolation.experiment.entropy import run_entropy
    from attnbench.runtime.outputs import refuse_to_replace

    if not 0 <= seed < 2**63:
        raise AttnbenchError(f"--seed {seed}: accepted: an integer from 0 to 2^63-1")
    cfg = load_preset(preset)
    if checkpoints is not None and not checkpoints.is_dir():
        raise AttnbenchError(
            f"--checkpoints {checkpoints}: no such folder; accepted: the checkpoints folder of "
            f"`attnbench run extrapolate` (default runs/extrapolate/{cfg.preset}/checkpoints)"
        )
    out_dir = out_dir or Path("runs") / "entropy" / cfg.preset
    refuse_to_replace(
        [out_dir / f"entropy.{suffix}" for suffix in ("csv", "json", "png")],
        option="--out", folder=out_dir, inputs=[corpus] if corpus else [], overwrite=overwrite,
    )  # fmt: skip
    opts = EntropyOptions(
        out=out_dir,
        checkpoints=checkpoints or Path("runs") / "extrapolate" / cfg.preset / "checkpoints",
        min_n=min_n,
        max_n=max_n,
        dim=dim,
        queries=queries,
        trials=trials,
        seed=seed,
        corpus=str(corpus) if corpus is not None else None,
        log=lambda msg: err.print(msg, markup=False, highlight=False),
    )
    result = run_entropy(cfg, opts)
    out.print(result.text, markup=False, highlight=False)
    err.print(f"wrote {result.out}", markup=False, highlight=False)
