"""``attnbench gpu-check``: on a fresh GPU machine, the environment record, the GPU tests and
the default GPU suite, in one command of under ten minutes that the next run continues."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from attnbench.cli.common import err, out
from attnbench.core.errors import AttnbenchError


def gpu_check_cmd(
    out_dir: Annotated[
        Path, typer.Option("--out", help="The check's folder; run again with it to continue.")
    ] = Path("runs/gpu-check"),
    suite: Annotated[
        list[str] | None,
        typer.Option(
            "--suite",
            help="Another speed suite after the default GPU suite (repeatable), e.g. "
            "gpu/flex, gpu/libraries.",
        ),
    ] = None,
    no_tests: Annotated[bool, typer.Option("--no-tests", help="Skip the GPU tests.")] = False,
    budget_s: Annotated[
        float, typer.Option("--budget-s", help="Seconds for the whole check.", min=60)
    ] = 540.0,
    speed_s: Annotated[
        float, typer.Option("--speed-s", help="Seconds of the budget kept for the suites.", min=0)
    ] = 210.0,
    workers: Annotated[
        int | None,
        typer.Option(help="Test workers, >= 1 (default: each stage's, within the cores)."),
    ] = None,
    tests: Annotated[
        Path | None, typer.Option(help="The tests folder (default: the checkout's tests/).")
    ] = None,
    fresh: Annotated[
        bool, typer.Option(help="Run every test again (the earlier record is moved aside).")
    ] = False,
    cache_dir: Annotated[
        Path | None,
        typer.Option(help="Compile and autotune caches (default: ~/.cache/attnbench)."),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option(help="Say what would run (the tests collected), run nothing.")
    ] = False,
) -> None:
    """Check a GPU machine: environment, GPU tests, then the default GPU suite.

    Writes OUT/env.json; runs the tests marked gpu (pytest markers choose them: attnbench's
    kernels, then the library-backed paths) in parallel worker processes with a time limit per
    test, each outcome written as it ends (OUT/tests: events, JUnit XML, every worker's log);
    then, with the GPU to itself, the default GPU suite speed-gpu and any --suite (OUT/speed).
    Needs no network. Within --budget-s (9 minutes); what is left when it ends is continued by
    the same command: tests that have an outcome are not run again, a stopped suite resumes.

    Exit 0: all done and passed; 1: a test or a suite failed; 75: something is left for the
    next run.

    Example: [bold]attnbench gpu-check --suite gpu/flex[/bold]
    """
    import torch

    from attnbench.gpucheck import check, speedstage
    from attnbench.runtime.caches import compile_caches, resolve_caches

    package_root = Path(check.__file__).resolve().parent.parent.parent
    opts = _options(out_dir, suite, budget_s, speed_s, workers, fresh,
                    None if no_tests else (tests, package_root))  # fmt: skip
    caches = resolve_caches(cache_dir)
    if dry_run:
        env = speedstage.child_environment(caches.environment(), package_root)
        for line in check.plan_lines(opts, env):
            out.print(line, highlight=False, soft_wrap=True)
        return
    if not torch.cuda.is_available():
        raise AttnbenchError(
            "gpu-check needs a CUDA GPU, and torch sees none here; --dry-run shows what it "
            "would run"
        )
    log = _Log(out_dir / "gpu-check.log")
    with compile_caches(caches):
        result = check.gpu_check(opts, caches, log.line)
    out.print(f"gpu-check: tests {check.summary_text(result.tests)}", highlight=False)
    for s in result.speeds:
        out.print(f"gpu-check: {s.suite} {s.status} -> {s.folder}", highlight=False)
    if result.code == check.UNFINISHED:
        err.print("left for the next run: the same command continues it")
    raise typer.Exit(result.code)


def _options(out_dir: Path, suite: list[str] | None, budget_s: float, speed_s: float,
             workers: int | None, fresh: bool, tests: tuple[Path | None, Path] | None):  # fmt: skip
    """The check's options, the suites' names and the budget checked (one line, before anything
    runs), then the tests folder found (``tests``: ``--tests`` and the package's root; None:
    ``--no-tests``)."""
    from attnbench.bench.suite_choice import GPU_SUITE
    from attnbench.gpucheck import check
    from attnbench.runtime.tomlconfig import find_suite

    suites = (GPU_SUITE, *dict.fromkeys(s for s in (suite or []) if s != GPU_SUITE))
    for name in suites:
        find_suite(name)  # a bad name: one line, before anything runs
    if workers is not None and workers < 1:
        raise AttnbenchError(f"--workers {workers}: accepted: a number of test workers >= 1")
    if speed_s >= budget_s:
        raise AttnbenchError(
            f"--speed-s {speed_s:g} leaves no time for the tests in --budget-s "
            f"{budget_s:g}; accepted: --speed-s < --budget-s"
        )
    found = None if tests is None else check.find_tests(*tests, Path.cwd())
    return check.Options(out=out_dir, suites=suites, budget_s=budget_s, speed_s=speed_s,
                         workers=workers, fresh=fresh, tests=found)  # fmt: skip


class _Log:
    """Each line on stderr and in the check's log."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def line(self, text: str) -> None:
        typer.echo(text, err=True)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as f:
            f.write(text + "\n")
