"""Torch's and the libraries' warnings kept out of the terminal during a run: into the run's
warnings.log, counted, and said in the summary; attnbench's own messages still shown."""

from __future__ import annotations

import logging
import warnings
from dataclasses import replace

from typer.testing import CliRunner

from attnbench.bench.run import run_speed
from attnbench.core.spec import PathSpec
from attnbench.runtime.warning_log import WarningLog
from attnbench.variants import softmax
from tests.helpers.speed import tiny


def test_python_warnings_and_torch_logs_go_to_the_file(tmp_path, capsys):
    torch_logger = logging.getLogger("torch._dynamo")
    handler = logging.StreamHandler()  # as torch's: a handler on stderr
    torch_logger.addHandler(handler)
    library = logging.getLogger("fla.some.module")
    library.propagate = False  # no handler anywhere above it: logging.lastResort prints it
    try:
        with WarningLog(tmp_path / "warnings.log") as log:
            warnings.warn("TF32 is off", UserWarning, stacklevel=1)
            torch_logger.warning("recompiling: %s", "a new shape")
            library.warning("no handler of its own")
            logging.getLogger("attnbench").warning("ours")
    finally:
        torch_logger.removeHandler(handler)
        library.propagate = True
    text = (tmp_path / "warnings.log").read_text()
    assert "TF32 is off" in text and "recompiling: a new shape" in text
    assert "no handler of its own" in text and "ours" not in text
    assert log.count == 3
    err = capsys.readouterr().err
    assert "TF32" not in err and "recompiling" not in err
    summary = log.summary()
    assert summary["count"] == 3 and summary["file"] == "warnings.log"
    assert any("TF32 is off" in k["warning"] for k in summary["kinds"])
    # After the run, warnings show again.
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        warnings.warn("after", UserWarning, stacklevel=1)
    assert len(seen) == 1


def test_no_warning_no_file(tmp_path):
    with WarningLog(tmp_path / "warnings.log") as log:
        pass
    assert log.count == 0 and not (tmp_path / "warnings.log").exists()
    assert log.summary()["file"] is None


def test_a_run_counts_its_warnings_and_the_summary_says_where(tmp_path):
    def noisy(q, k, v, causal=False):
        warnings.warn("a backend refused this call", UserWarning, stacklevel=2)
        return softmax.MECHANISM.default_path.fn(q, k, v, causal=causal)

    paths = (softmax.MECHANISM.reference, PathSpec("efficient", "efficient", noisy, memory="O(n)"))
    mech = replace(softmax.MECHANISM, name="noisy", aliases=(), paths=paths)
    run = run_speed(tiny(mechanisms=("noisy",), lengths=(16,)), tmp_path,
                    mechanisms=[softmax.MECHANISM, mech])  # fmt: skip
    assert run.warnings >= 1 and run.warnings_file == tmp_path / "warnings.log"
    assert "a backend refused this call" in run.warnings_file.read_text()
    from attnbench.cli.speed_report import summary_json, warnings_line

    assert warnings_line(run).startswith(f"{run.warnings} warning")
    assert '"count": ' in summary_json(run, [])
    import json

    sidecar = json.loads(run.sidecar.read_text())
    assert sidecar["torch_warnings"]["count"] == run.warnings
    assert CliRunner  # the CLI prints the same line (speed_report.print_summary)
