"""``attnbench check``: a mechanism's faster paths against its reference, on random inputs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from attnbench.cli.common import out, parse_params
from attnbench.core.errors import AttnbenchError

if TYPE_CHECKING:
    from attnbench.core.spec import Shape

# torch and the registry are imported inside the command: `--help` must not wait for them.
DTYPES = ("float64", "float32", "float16", "bfloat16")
DEVICES = ("cpu", "cuda")


def check(
    name: Annotated[str, typer.Argument(help="Mechanism name (see `attnbench list`).")],
    path: Annotated[
        list[str] | None, typer.Option("--path", help="Path to check (repeatable); default all.")
    ] = None,
    param: Annotated[
        list[str] | None, typer.Option("--param", "-p", help="NAME=VALUE (repeatable).")
    ] = None,
    n: Annotated[int, typer.Option("--n", help="Sequence length.", min=1)] = 97,
    batch: Annotated[int, typer.Option(help="Batch size.", min=1)] = 2,
    heads: Annotated[int, typer.Option(help="Query heads.", min=1)] = 4,
    head_dim: Annotated[int, typer.Option(help="Head dimension.", min=1)] = 32,
    causal: Annotated[bool, typer.Option("--causal/--no-causal", help="Causal masking.")] = False,
    dtype: Annotated[
        str, typer.Option(help="float64, float32, float16 or bfloat16 (the last two: GPU paths).")
    ] = "float32",
    device: Annotated[str, typer.Option(help="cpu or cuda (fused paths need cuda).")] = "cpu",
    seed: Annotated[int, typer.Option(help="Seed of the random inputs.")] = 0,
) -> None:
    """Check every faster path of a mechanism against its dense reference (outputs and
    gradients), with flash-attention's tolerance rule. Exit code 1 if a path fails. Paths that
    cannot run on this machine are shown as skipped; one asked for with --path is an error.

    Example: [bold]attnbench check softmax-logn --param base=e --causal --n 257[/bold]
    """
    import torch
    from rich.markup import escape
    from rich.table import Table

    from attnbench import registry
    from attnbench.api import check_tensors
    from attnbench.core.inputs import make_inputs
    from attnbench.core.spec import Shape
    from attnbench.core.testing import compare_paths

    mech = registry.get(name)
    params = mech.resolve(parse_params(param))
    if dtype not in DTYPES:
        raise AttnbenchError(f"unknown dtype {dtype!r}; accepted: {', '.join(DTYPES)}")
    if device not in DEVICES:
        raise AttnbenchError(f"unknown device {device!r}; accepted: {', '.join(DEVICES)}")
    if device == "cuda" and not torch.cuda.is_available():
        raise AttnbenchError("--device cuda: no CUDA GPU is visible to torch; use --device cpu")
    problems = mech.not_supported_reasons(device=None, causal=causal)
    if problems:
        raise AttnbenchError(f"{'; '.join(problems)}; {'drop' if causal else 'add'} --causal")
    # A path asked for by name must run here (else one line, exit 2); without --path, paths that
    # cannot run here are listed as skipped, with the reason.
    paths = (
        [
            mech.require(
                p,
                device=device,
                dtype=getattr(torch, dtype),
                backward=mech.backward and mech.select(p).backward,
            )
            for p in path
        ]
        if path
        else [p for p in mech.paths if p.kind != "reference"]
    )
    shape = mech.shape_for(Shape(batch, heads, n, head_dim), params)
    if device == "cpu":
        refuse_if_too_big(shape)
    inputs = make_inputs(mech, shape, params, dtype=getattr(torch, dtype), device=device, seed=seed)
    check_tensors(mech, inputs["q"], inputs["k"], inputs["v"])
    direction = "causal" if causal else "bidirectional"
    table = Table(title=f"{mech.name} {shape.tag()} {direction} {dtype} {device}")
    for col in ("path", "tensor", "error", "allowed", "naive baseline", "verdict"):
        table.add_column(col)
    failed = 0
    kwargs = {"causal": causal, **params}
    for p in paths:
        reasons = mech.not_supported_reasons(
            p, device=device, dtype=getattr(torch, dtype), backward=mech.backward and p.backward
        )
        reason = "; ".join(reasons)
        if reason:
            table.add_row(p.name, "-", "-", "-", "-", f"[yellow]skipped: {escape(reason)}[/yellow]")
            continue
        try:
            verdicts = compare_paths(
                p,
                mech.reference,
                inputs,
                kwargs,
                backward=mech.backward and p.backward,
                tolerance=p.tolerance,
            )
        except AttnbenchError as e:  # the path refuses these params / this call
            if path:  # asked for by name: one line, exit 2
                raise
            table.add_row(p.name, "-", "-", "-", "-", f"[yellow]skipped: {escape(str(e))}[/yellow]")
            continue
        for v in verdicts:
            failed += not v.ok
            table.add_row(
                p.name,
                v.name,
                f"{v.error:.3g}",
                f"{v.allowed:.3g}",
                f"{v.baseline:.3g}",
                "[green]ok[/green]" if v.ok else "[red]FAIL[/red]",
            )
    out.print(table)
    if failed:
        raise typer.Exit(1)


#: Dense n x n float64 tensors alive at once in the reference's forward and backward (scores,
#: probabilities, their gradients): what ``check`` needs memory for.
DENSE_COPIES = 4


def refuse_if_too_big(shape: Shape) -> None:
    """The float64 oracle builds B x H x n x n; refuse, with what fits, before allocating it."""
    from attnbench.measure import machine

    available = machine.available_memory_bytes()
    if available is None:
        return
    per_square = DENSE_COPIES * 8 * shape.batch * shape.heads  # bytes per (query, key) pair
    need = per_square * shape.seq_len**2
    if need <= 0.8 * available:
        return
    longest = int((0.8 * available / per_square) ** 0.5)
    raise AttnbenchError(
        f"--n {shape.seq_len}: the dense float64 reference builds batch x heads x n x n scores, "
        f"about {need / 2**30:.0f} GiB with its backward, and this machine has "
        f"{available / 2**30:.1f} GiB available; accepted here: --n up to about {longest} "
        "(or fewer --heads / --batch)"
    )
