"""``attnbench run extrapolate`` and ``attnbench run entropy`` (Su 2021)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from attnbench.cli.common import err, fail, out, parse_params
from attnbench.core.errors import AttnbenchError

INTERRUPTED = 130

Preset = Annotated[
    str,
    typer.Option(
        "--preset",
        "-p",
        help="Preset name (suites/extrapolate/NAME.toml: cpu, paper) or a TOML file.",
    ),
]


def _overrides(**values) -> dict[str, object]:
    """CLI options that were given (not None), as {"section.field": value}."""
    return {k.replace("__", "."): v for k, v in values.items() if v is not None}


def extrapolate(
    preset: Preset = "cpu",
    seeds: Annotated[int | None, typer.Option(help="Training seeds (0..N-1).")] = None,
    seed_start: Annotated[int | None, typer.Option(help="First seed.")] = None,
    variants: Annotated[
        str | None,
        typer.Option(
            help="Trained variants, comma-separated: O, E, E-ln, preset \\[variants] tables or "
            "registry names."
        ),
    ] = None,
    impl: Annotated[
        list[str] | None,
        typer.Option(
            help="Also train this registry mechanism (NAME or NAME:PATH; 'all': every "
            "bidirectional one). Repeatable."
        ),
    ] = None,
    param: Annotated[
        list[str] | None,
        typer.Option(help="NAME=VALUE parameter for the --impl mechanisms. Repeatable."),
    ] = None,
    eval_time: Annotated[
        str | None,
        typer.Option(
            help="Eval-time rows on the trained O, comma-separated (logn, temperature, yarn, "
            "local, chunk, ntk, pi, rerope; compose with +, e.g. rerope+logn; 'none')."
        ),
    ] = None,
    corpus: Annotated[
        Path | None,
        typer.Option(
            help="A text file or a folder of .txt files (default: the shipped Shakespeare)."
        ),
    ] = None,
    out_dir: Annotated[
        Path | None, typer.Option("--out", help="Output folder (default runs/extrapolate/PRESET).")
    ] = None,
    checkpoints: Annotated[
        Path | None, typer.Option(help="Checkpoint folder (default OUT/checkpoints).")
    ] = None,
    resume: Annotated[bool, typer.Option(help="Continue the checkpoints in the folder.")] = False,
    eval_only: Annotated[
        bool, typer.Option(help="Only re-evaluate finished checkpoints (no training).")
    ] = False,
    train_only: Annotated[
        bool,
        typer.Option(
            help="Train (or with --resume continue) the checkpoints and stop; evaluate later "
            "with --eval-only. The one mode torchrun may start (data-parallel training)."
        ),
    ] = False,
    overwrite: Annotated[bool, typer.Option(help="Retrain even if checkpoints exist.")] = False,
    d_model: Annotated[int | None, typer.Option(help="Model width.")] = None,
    layers: Annotated[int | None, typer.Option(help="Blocks.")] = None,
    heads: Annotated[int | None, typer.Option(help="Attention heads.")] = None,
    ffn_mult: Annotated[int | None, typer.Option(help="FFN width / d_model.")] = None,
    train_len: Annotated[int | None, typer.Option(help="Training length L.")] = None,
    batch: Annotated[int | None, typer.Option(help="Windows per training step.")] = None,
    steps: Annotated[int | None, typer.Option(help="Training steps.")] = None,
    lr: Annotated[float | None, typer.Option(help="Peak learning rate (AdamW).")] = None,
    warmup: Annotated[int | None, typer.Option(help="Warm-up steps.")] = None,
    mask_prob: Annotated[float | None, typer.Option(help="Masking probability.")] = None,
    eval_lengths: Annotated[
        str | None, typer.Option(help="Evaluation lengths, comma-separated.")
    ] = None,
    eval_tokens: Annotated[
        int | None,
        typer.Option(help="Held-out tokens evaluated at every length (cut into windows of n)."),
    ] = None,
    threads: Annotated[int | None, typer.Option(help="CPU threads (0: all).")] = None,
    device: Annotated[
        str | None, typer.Option(help="auto (a GPU when there is one), cpu, cuda, cuda:N.")
    ] = None,
    ckpt_every: Annotated[int | None, typer.Option(help="Steps between checkpoints.")] = None,
    set_: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            help="Any setting as SECTION.FIELD=VALUE (e.g. train.min_lr_ratio=0.05). Repeatable.",
        ),
    ] = None,
    tensorboard: Annotated[
        Path | None,
        typer.Option(
            help="Also log the training curves to TensorBoard in this folder (needs "
            "pip install tensorboard; curves.csv is written either way)."
        ),
    ] = None,
    executor: Annotated[
        str,
        typer.Option(
            help="Where the trainings run: local (worker processes here) or ray (a Ray task "
            'each; pip install "attnbench\\[ray]").'
        ),
    ] = "local",
    ray_address: Annotated[
        str | None,
        typer.Option(help="--executor ray: the cluster to join (default: start a local Ray)."),
    ] = None,
    shard: Annotated[
        str | None,
        typer.Option(
            help="I/N: train only trainings I, I+N, ... (an array job's task; implies "
            "--train-only); then --eval-only evaluates them all."
        ),
    ] = None,
    list_units: Annotated[
        bool,
        typer.Option("--list-units", help="Print the run's units as JSON (trainings, evaluation)."),
    ] = False,
) -> None:
    """Train a byte-level MLM encoder at one length and measure accuracy at longer ones.

    Su 2021: Attention-O vs Attention-E (log_512 n), registry mechanisms, eval-time tricks.

    Writes extrapolate.csv, extrapolate.json, table.md and accuracy_vs_length.png to --out.

    Checkpoints per (variant, seed): --resume, --eval-only, --train-only; Ctrl-C saves one.

    Several GPUs: torchrun --nproc_per_node G -m attnbench run extrapolate --train-only ...

    Example: [bold]attnbench run extrapolate --seeds 3 --impl local --out results/x[/bold]
    """
    from attnbench.cli.progress import default_progress
    from attnbench.extrapolation.config import load_preset
    from attnbench.extrapolation.run import RunOptions, run_extrapolate
    from attnbench.extrapolation.train import Interrupted

    if tensorboard is not None:
        from attnbench.extrapolation.curves import require_tensorboard

        require_tensorboard()
    cfg = load_preset(preset)
    values = _overrides(
        run__seeds=seeds,
        run__seed_start=seed_start,
        run__variants=variants,
        run__eval_time=eval_time,
        run__corpus=str(corpus) if corpus is not None else None,
        run__threads=threads,
        run__device=device,
        run__ckpt_every=ckpt_every,
        model__d_model=d_model,
        model__layers=layers,
        model__heads=heads,
        model__ffn_mult=ffn_mult,
        model__train_len=train_len,
        train__batch=batch,
        train__steps=steps,
        train__lr=lr,
        train__warmup=warmup,
        train__mask_prob=mask_prob,
        eval__lengths=eval_lengths,
        eval__tokens=eval_tokens,
    )
    for key, value in parse_params(set_, "--set", "train.steps=500").items():
        values[key] = value
    cfg = cfg.override(values)
    if sum((resume, eval_only, overwrite)) > 1:
        raise fail("--resume, --eval-only and --overwrite exclude each other")
    from attnbench.runtime.engines import parse_shard

    parsed_shard = parse_shard(shard) if shard is not None else None
    train_only = train_only or parsed_shard is not None
    opts = RunOptions(
        out=out_dir or Path("runs") / "extrapolate" / cfg.preset,
        checkpoints=checkpoints,
        resume=resume,
        eval_only=eval_only,
        train_only=train_only,
        overwrite=overwrite,
        impls=list(impl or []),
        impl_params=parse_params(param),
        log=lambda msg: err.print(msg, markup=False, highlight=False),
        progress=default_progress,
        tensorboard=tensorboard,
        executor=executor,
        ray_address=ray_address,
        shard=parsed_shard,
    )
    if list_units:
        from attnbench.extrapolation.run import list_units as units_of

        opts.check()
        typer.echo(json.dumps(units_of(cfg, opts), indent=1))
        return
    try:
        result = run_extrapolate(cfg, opts)
    except Interrupted as e:
        typer.echo(
            f"interrupted at step {e.step}/{e.total}; checkpoint {e.path}; continue with --resume",
            err=True,
        )
        raise typer.Exit(INTERRUPTED) from None
    if train_only:  # no table: the run's last line said where the checkpoints are
        return
    out.print(result.table, markup=False, highlight=False)
    err.print(f"wrote {result.out}", markup=False, highlight=False)


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
    min_n: Annotated[int, typer.Option(help="Shortest length (power of 2 steps).")] = 16,
    max_n: Annotated[int, typer.Option(help="Longest length.")] = 4096,
    dim: Annotated[int, typer.Option(help="Head dim d of the random q, k.")] = 64,
    queries: Annotated[int, typer.Option(help="Random queries per length and trial.")] = 256,
    trials: Annotated[int, typer.Option(help="Random draws per length.")] = 4,
    seed: Annotated[int, typer.Option(help="Seed of the random q, k.")] = 0,
    corpus: Annotated[
        Path | None, typer.Option(help="Text for the trained models (default: as trained).")
    ] = None,
) -> None:
    """Entropy of attention rows as n grows, for Attention-O and Attention-E.

    (a) random q, k of norm sqrt(d); (b) inside the trained models, when checkpoints exist.

    Fits H = log n - c*lambda*d + b (Su 2021: c about 0.24) and reports dH/dlog n.

    Writes entropy.csv, entropy.json and entropy.png.

    Example: [bold]attnbench run entropy --max-n 1024[/bold]
    """
    from attnbench.extrapolation.config import load_preset
    from attnbench.extrapolation.entropy import EntropyOptions, run_entropy

    cfg = load_preset(preset)
    if checkpoints is not None and not checkpoints.is_dir():
        raise AttnbenchError(
            f"--checkpoints {checkpoints}: no such folder; accepted: the checkpoints folder of "
            f"`attnbench run extrapolate` (default runs/extrapolate/{cfg.preset}/checkpoints)"
        )
    opts = EntropyOptions(
        out=out_dir or Path("runs") / "entropy" / cfg.preset,
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
