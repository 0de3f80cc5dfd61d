"""``attnbench check``: a mechanism's faster paths against its reference, on random inputs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from attnbench.cli.common import Choice, out, parse_params
from attnbench.core.errors import AttnbenchError

if TYPE_CHECKING:
    from rich.table import Table

    from attnbench.core.spec import Mechanism, PathSpec, Shape

# torch and the registry are imported inside the command: `--help` must not wait for them.


class Dtype(Choice):
    """``--dtype``: the dtype of the random inputs (float16 and bfloat16: GPU paths)."""

    float64 = "float64"
    float32 = "float32"
    float16 = "float16"
    bfloat16 = "bfloat16"

    @classmethod
    def bad_value(cls, option: str, value: object) -> str:
        return f"unknown dtype {value!r}; accepted: {', '.join(cls.values())}"


class Device(Choice):
    """``--device``: where the inputs live and the paths run (fused paths need cuda)."""

    cpu = "cpu"
    cuda = "cuda"

    @classmethod
    def bad_value(cls, option: str, value: object) -> str:
        return f"unknown device {value!r}; accepted: {', '.join(cls.values())}"


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
        Dtype, typer.Option(help="Input dtype (float16 and bfloat16: GPU paths).")
    ] = Dtype.float32,
    device: Annotated[Device, typer.Option(help="Where to run (fused paths need cuda).")] = (
        Device.cpu
    ),
    seed: Annotated[int, typer.Option(help="Seed of the random inputs.")] = 0,
) -> None:
    """Check every faster path of a mechanism against its dense reference.

    Outputs and gradients, with flash-attention's tolerance rule. Exit code 1 if a path fails.
    Paths that cannot run on this machine are shown as skipped; one asked for with --path is an
    error.

    Example: [bold]attnbench check softmax-logn --param base=e --causal --n 257[/bold]
    """
    import torch
    from rich.table import Table

    from attnbench import registry
    from attnbench.api import check_tensors
    from attnbench.core.inputs import make_inputs
    from attnbench.core.spec import Shape

    mech = registry.get(name)
    params = mech.resolve(parse_params(param))
    device_name, torch_dtype = device.value, getattr(torch, dtype.value)
    if device is Device.cuda and not torch.cuda.is_available():
        raise AttnbenchError("--device cuda: no CUDA GPU is visible to torch; use --device cpu")
    problems = mech.not_supported_reasons(device=None, causal=causal)
    if problems:
        raise AttnbenchError(f"{'; '.join(problems)}; {'drop' if causal else 'add'} --causal")
    paths = paths_to_check(mech, path, device_name, torch_dtype)
    shape = mech.shape_for(Shape(batch, heads, n, head_dim), params)
    if device is Device.cpu:
        refuse_if_too_big(shape)
    inputs = make_inputs(mech, shape, params, dtype=torch_dtype, device=device_name, seed=seed)
    check_tensors(mech, inputs["q"], inputs["k"], inputs["v"])
    direction = "causal" if causal else "bidirectional"
    table = Table(title=f"{mech.name} {shape.tag()} {direction} {dtype.value} {device_name}")
    for col in ("path", "tensor", "error", "allowed", "naive baseline", "verdict"):
        table.add_column(col)
    kwargs = {"causal": causal, **params}
    failed = sum(
        check_path(table, mech, p, inputs, kwargs, device_name, torch_dtype, asked=bool(path))
        for p in paths
    )
    out.print(table)
    if failed:
        raise typer.Exit(1)


def paths_to_check(
    mech: Mechanism, asked: list[str] | None, device: str, dtype: Any
) -> list[PathSpec]:
    """The paths asked for by name, each of which must run here (else one line, exit 2); without
    --path, every faster path (those that cannot run here are listed as skipped, with the
    reason)."""
    if not asked:
        return [p for p in mech.paths if p.kind != "reference"]
    return [
        mech.require(
            p, device=device, dtype=dtype, backward=checks_backward(mech, mech.select(p), device)
        )
        for p in asked
    ]


def checks_backward(mech: Mechanism, p: PathSpec, device: str) -> bool:
    """Whether ``check`` compares gradients: where the mechanism and path have a backward, and
    the path runs it here. A path that runs only forward here (FlexAttention on the CPU) is
    checked forward."""
    if not (mech.backward and p.backward):
        return False
    return not p.not_supported_reasons(device, True) or bool(p.not_supported_reasons(device, False))


def check_path(
    table: Table,
    mech: Mechanism,
    p: PathSpec,
    inputs: dict[str, Any],
    kwargs: dict[str, Any],
    device: str,
    dtype: Any,
    *,
    asked: bool,
) -> int:
    """One path against the reference: a table row per compared tensor (or one ``skipped``
    row, with the reason); returns how many tensors failed."""
    from rich.markup import escape

    from attnbench.core.testing import compare_paths

    backward = checks_backward(mech, p, device)
    reason = "; ".join(mech.not_supported_reasons(p, device=device, dtype=dtype, backward=backward))
    if reason:
        table.add_row(p.name, "-", "-", "-", "-", f"[yellow]skipped: {escape(reason)}[/yellow]")
        return 0
    try:
        verdicts = compare_paths(
            p, mech.reference, inputs, kwargs, backward=backward, tolerance=p.tolerance
        )
    except AttnbenchError as e:  # the path refuses these params / this call
        if asked:  # asked for by name: one line, exit 2
            raise
        table.add_row(p.name, "-", "-", "-", "-", f"[yellow]skipped: {escape(str(e))}[/yellow]")
        return 0
    for v in verdicts:
        table.add_row(
            p.name,
            v.name,
            f"{v.error:.3g}",
            f"{v.allowed:.3g}",
            f"{v.baseline:.3g}",
            "[green]ok[/green]" if v.ok else "[red]FAIL[/red]",
        )
    return sum(not v.ok for v in verdicts)


#: Dense n x n float64 tensors alive at once in the reference's forward and backward (scores,
#: probabilities, their gradients): what ``check`` needs memory for.
DENSE_COPIES = 4


def refuse_if_too_big(shape: Shape) -> None:
    """The float64 oracle builds B x H x n x n; refuse, with what fits, before allocating it."""
    from attnbench.measure import machine

    per_square = DENSE_COPIES * 8 * shape.batch * shape.heads  # bytes per (query, key) pair
    machine.refuse_if_too_big(
        "--n",
        shape.seq_len,
        lambda n: per_square * n**2,
        "the dense float64 reference builds batch x heads x n x n scores (with its backward)",
        " (or fewer --heads / --batch)",
    )
