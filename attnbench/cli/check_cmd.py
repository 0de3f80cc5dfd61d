"""``attnbench check``: a mechanism's faster paths against its reference, on random inputs."""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Annotated, Any

import typer

from attnbench.cli.common import Choice, out, parse_params
from attnbench.core.errors import AttnbenchError

if TYPE_CHECKING:
    from rich.table import Table

    from attnbench.core.spec import Mechanism, PathSpec, Shape

# torch and the registry are imported inside the command: `--help` must not wait for them.

#: The largest seed a random generator takes (torch.manual_seed: a 64-bit integer).
SEED_MAX = 2**63 - 1


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
    seed: Annotated[int, typer.Option(help="Seed of the random inputs, 0 to 2^63-1.")] = 0,
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

    if not 0 <= seed <= SEED_MAX:
        raise AttnbenchError(f"--seed {seed}: accepted: an integer from 0 to 2^63-1")
    mech = registry.get(name)
    params = mech.resolve(parse_params(param))
    device_name, torch_dtype = device.value, getattr(torch, dtype.value)
    if device is Device.cuda and not torch.cuda.is_available():
        raise AttnbenchError("--device cuda: no CUDA GPU is visible to torch; use --device cpu")
    problems = mech.not_supported_reasons(device=None, causal=causal)
    if problems:
        raise AttnbenchError(f"{'; '.join(problems)}; {'drop' if causal else 'add'} --causal")
    paths = paths_to_check(mech, path, device_name, torch_dtype)
    shape = Shape(batch, heads, n, head_dim)
    if device is Device.cpu:
        refuse_if_too_big(mech, shape, parse_params(param))
    shape = mech.shape_for(shape, params)
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
#: float64 copies of every input alive at once: the input, its gradient, the float64 draw it is
#: made from (:func:`attnbench.core.inputs.make_inputs`).
INPUT_COPIES = 3
#: Each size's default, against which ``refuse_if_too_big`` finds the one to blame.
DEFAULT_SIZES = {"--n": 97, "--batch": 2, "--heads": 4, "--head-dim": 32}


def refuse_if_too_big(mech: Mechanism, shape: Shape, given: dict[str, str]) -> None:
    """The float64 oracle builds B x H x n x n scores, and the inputs (q, k, v and the
    mechanism's own, whose size a parameter may set: a window, an expansion) are drawn in
    float64: refuse, naming the size or ``--param`` to bring down and how far, before any of
    it is allocated."""
    from attnbench.core.inputs import input_elements
    from attnbench.core.spec import Shape
    from attnbench.measure import machine

    numeric = {f"--param {k}": int(v) for k, v in given.items() if v.strip().isdigit()}

    def need(s: dict[str, int]) -> float:
        values = {**given, **{k.removeprefix("--param "): str(v) for k, v in s.items()
                              if k.startswith("--param ")}}  # fmt: skip
        asked = Shape(s["--batch"], s["--heads"], s["--n"], s["--head-dim"])
        try:
            params = mech.resolve(values)
            case = mech.shape_for(asked, params)
            inputs = input_elements(mech, case, params)
        except (AttnbenchError, ValueError, TypeError):  # a value the mechanism refuses
            return math.inf
        pairs = case.batch * case.heads * case.seq_len * case.seq_len
        return 8.0 * (DENSE_COPIES * pairs + INPUT_COPIES * inputs)

    sizes = {"--n": shape.seq_len, "--batch": shape.batch, "--heads": shape.heads,
             "--head-dim": shape.head_dim, **numeric}  # fmt: skip
    found = machine.too_big(
        sizes, need, "the dense float64 reference builds batch x heads x n x n scores and the "
        "inputs (with their backward)", {**DEFAULT_SIZES, **{k: 1 for k in numeric}},
    )  # fmt: skip
    if found is not None:  # --param NAME=VALUE, as it was given
        raise AttnbenchError(re.sub(r"^(--param \S+) ", r"\1=", found[1]))
