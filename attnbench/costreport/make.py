"""``attnbench report``'s work, from two folders to the written files."""

from __future__ import annotations

from pathlib import Path

from attnbench.core.errors import AttnbenchError
from attnbench.costreport.join import DIRECTIONS, build_report
from attnbench.costreport.tables import read_extrapolation, read_speed
from attnbench.costreport.write import Written, not_joined_lines, write_report


def make_report(
    extrapolation_dir: Path,
    speed_dir: Path,
    out: Path,
    *,
    direction: str = "fwd",
    command: str = "attnbench report",
    fmt: str = "png",
    overwrite: bool = False,
) -> Written:
    """Read both folders, join them, then write the CSV, the figures and ``report.md`` into
    ``out``. Bad input, and an earlier report in ``out`` without ``overwrite``, raise an
    AttnbenchError before anything is written."""
    if direction not in DIRECTIONS:
        raise AttnbenchError(f"--direction {direction!r}: accepted: {', '.join(DIRECTIONS)}")
    extrapolation = read_extrapolation(Path(extrapolation_dir))
    speed = read_speed(Path(speed_dir))
    report = build_report(extrapolation, speed, direction)
    if not report.points:
        first = not_joined_lines(report.not_joined)[:1]
        example = f" (e.g. {first[0]})" if first else ""
        raise AttnbenchError(
            f"no row of {extrapolation.folder} joins a case of {speed.folder}{example}; "
            "nothing written"
        )
    return write_report(report, extrapolation, speed, Path(out), command, fmt, overwrite)
