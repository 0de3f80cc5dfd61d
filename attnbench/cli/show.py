"""``attnbench show NAME``: draw a mechanism's attention pattern (terminal and PNG)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from attnbench.cli.common import out, parse_params
from attnbench.core.errors import AttnbenchError


def show(
    name: Annotated[str, typer.Argument(help="Mechanism name (see attnbench list).")],
    n: Annotated[
        int, typer.Option("--n", help="Sequence length, >= 1: up to 128 shown, 4096 with --out.")
    ] = 64,
    param: Annotated[
        list[str] | None,
        typer.Option("--param", "-p", help="A parameter as NAME=VALUE (repeatable)."),
    ] = None,
    causal: Annotated[bool, typer.Option("--causal", help="The causal form.")] = False,
    out_path: Annotated[
        Path | None, typer.Option("--out", help="Also write the pattern to this PNG file.")
    ] = None,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Replace an --out file that is already there.")
    ] = False,
) -> None:
    """Draw which keys each query attends: one cell per (query, key) pair.

    Up to n = 128 in the terminal; with --out, a PNG up to n = 4096.

    Example: [bold]attnbench show local --n 64 --param window=8 --causal --out local.png[/bold]
    """
    from attnbench import registry
    from attnbench.render.pattern_view import (
        MAX_PNG_N,
        MAX_TERMINAL_N,
        pattern_of,
        save_png,
        to_rich,
    )
    from attnbench.runtime.outputs import refuse_to_replace

    mech = registry.get(name)
    if out_path is not None:
        refuse_to_replace([out_path], option="--out", overwrite=overwrite)
    if n > MAX_PNG_N or (out_path is None and n > MAX_TERMINAL_N):
        limit = MAX_PNG_N if out_path is not None else MAX_TERMINAL_N
        hint = "" if out_path is not None else f"; use --out FILE.png for up to {MAX_PNG_N}"
        raise AttnbenchError(f"--n {n} is too large to draw (at most {limit}){hint}")
    view = pattern_of(mech, n, causal, parse_params(param))
    out.print(view.title, style="bold", highlight=False)
    out.print(view.summary, highlight=False)
    if n <= MAX_TERMINAL_N:
        out.print(to_rich(view, out.width), soft_wrap=True)
    if out_path is not None:
        written = save_png(view, out_path)
        out.print(f"wrote {written}", highlight=False)
