"""Bad input: one line saying what is wrong and what is accepted; ValueError from Python, exit 2
and no traceback from the CLI. The CLI's cases are one table, run through the real executable
(:data:`BAD_INVOCATIONS`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from attnbench import registry
from attnbench.api import attention, parse_impl
from attnbench.bench.results import COLUMNS
from attnbench.cli import app

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]


def qkv(b=1, h=4, t=8, d=16, hkv=None, dk=None):
    return (
        torch.randn(b, h, t, d),
        torch.randn(b, hkv or h, t, dk or d),
        torch.randn(b, hkv or h, t, d),
    )


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: registry.get("softmx"), "did you mean 'softmax'"),
        (lambda: parse_impl("softmax:fast"), "available: reference, efficient"),
        (lambda: attention("softmax-logn", *qkv(), base=1), "accepted: a number > 1, or e"),
        (lambda: attention("softmax-logn", *qkv(), base="x"), "invalid base='x'"),
        (lambda: attention("softmax-logn", *qkv(), min_n=0), "an integer >= 1"),
        (lambda: attention("gqa", *qkv(h=4, hkv=3), kv_heads=3), "does not divide heads=4"),
        (lambda: attention("gqa", *qkv(h=4, hkv=1), kv_heads=2), "kv_heads=2; they must match"),
        (lambda: attention("softmax", *qkv(hkv=2)), "use mqa or gqa"),
        (lambda: attention("softmax", *qkv(dk=8)), "head dims differ"),
        (lambda: attention("softmax", torch.randn(4, 8, 16), *qkv()[1:]), "rank 4"),
        (lambda: attention("softmax", *qkv(), window=3), "takes no argument 'window'"),
        (lambda: attention("flash-tiled", *qkv(), tile=0), "an integer >= 1"),
        (lambda: attention("softmax", *qkv(), path="fused"), "has no path 'fused'"),
    ],
)
def test_python_errors(call, message):
    with pytest.raises(ValueError, match=None) as info:
        call()
    text = str(info.value)
    assert message in text, text
    assert "\n" not in text


#: A preset whose one [variants.NAME] table names no mechanism: refused whether or not
#: run.variants selects it (issue 35: unselected, the run went on and wrote its results).
TYPO_PRESET = """
[run]
variants = ["O"]
eval_time = []
[variants.typo]
mechanism = "softmaxx"
"""


#: A suite whose one case needs more memory than any machine has (issue 63: an oom row before).
BIG_BATCH = '[grid]\ndevice = "cpu"\nlengths = [1024]\n[shape]\nbatch = 1000000000000\n'
#: A suite nested 5000 deep (issue 63: a RecursionError from the TOML reader before).
DEEP = "x = " + "[" * 5000 + "]" * 5000 + "\n"


def bom_results(text: str) -> str:
    """A results CSV as a spreadsheet saves it, with a UTF-8 byte-order mark in front."""
    return "\ufeff" + text


#: Bad invocations of the real executable: (arguments, files written into the working folder
#: first, a fragment of the one line on stderr). Each must exit 2 with that one line, no
#: traceback, and leave the folder as it was: nothing written, nothing changed.
BAD_INVOCATIONS: list[tuple[list[str], dict[str, str], str]] = [
    (["check", "softmx"], {}, "unknown mechanism 'softmx'"),
    (["check", "softmax-logn", "--param", "base=0.5"], {}, "invalid base"),
    (["check", "softmax-logn", "--param", "base"], {}, "is not NAME=VALUE"),
    (["check", "gqa", "--heads", "3"], {}, "does not divide"),
    (["check", "softmax", "--path", "fused"], {}, "has no path 'fused'"),
    (["check", "softmax", "--param", "tile=3"], {}, "takes no parameters"),
    (["check", "softmax", "--n", "10000000"], {}, "--n 10000000: the dense float64 reference"),
    (["list", "--family", "nope"], {}, "unknown family"),
    (["list", "--format", "xml"], {}, "--format 'xml': accepted: table, json, csv"),
    (["list", "-f", "xml"], {}, "--format 'xml': accepted: table, json, csv"),
    (["check", "softmax", "--dtype", "half"], {}, "unknown dtype 'half'; accepted: float64"),
    (["check", "softmax", "--device", "tpu"], {}, "unknown device 'tpu'; accepted: cpu, cuda"),
    (["run", "speed", "--device", "tpu"], {}, "--device 'tpu': accepted: auto, cpu, cuda"),
    (["plot", "r.csv", "--format", "jpg"], {}, "--format 'jpg': accepted: png, svg"),
    (["export", "r.csv", "--to", "gh"], {}, "unknown --to target 'gh'"),
    (["run", "speed", "--resume", "--overwrite"], {}, "exclude each other"),
    (["compare", "a.csv", "b.csv", "--mem-tolerance", "nan"], {}, "a number from 0 to 10"),
    (["run", "extrapolate", "--lr", "inf", "--steps", "1"], {}, "--lr inf: train.lr = inf is not"),
    (["run", "extrapolate", "--lr", "nan", "--steps", "1"], {}, "--lr nan: train.lr = nan is not"),
    (["run", "extrapolate", "--set", "train.grad_clip=nan"], {}, "grad_clip = nan is not"),
    ([], {}, "error: no command given; accepted: list, check, show, plot, compare, export"),
    (["run"], {}, "error: no command given; accepted: speed, extrapolate, entropy"),
    (["nosuch"], {}, "No such command 'nosuch'; accepted: list, check"),
    (["run", "nosuch"], {}, "No such command 'nosuch'; accepted: speed, extrapolate, entropy"),
    # Issue 35: a preset's variant naming an unknown mechanism, however small the run.
    (
        ["run", "extrapolate", "--preset", "typo.toml", "--steps", "1", "--eval-lengths", "64"],
        {"typo.toml": TYPO_PRESET},
        "typo.toml line 6: [variants.typo] unknown mechanism 'softmaxx' (did you mean 'softmax'",
    ),
    (
        ["run", "extrapolate", "--preset", "typo.toml", "--list-units"],
        {"typo.toml": TYPO_PRESET},
        "; known: softmax, softmax-logn,",
    ),
    # Issue 35: a length whose arrays cannot fit, refused before anything is allocated.
    (
        ["run", "entropy", "--max-n", "1000000000000000"],
        {},
        "--max-n 1000000000000000: the random part holds 4 draws",
    ),
    (["run", "entropy", "--max-n", "1000000000000000"], {}, "accepted here: --max-n up to about"),
    # Issue 35: a byte-order mark is not part of the first column's name: a BOM file with a
    # genuinely wrong header is told what is wrong with it, and nothing about "\ufeffsuite".
    (
        ["compare", "bom.csv", "bom.csv"],
        {"bom.csv": bom_results(",".join(c for c in COLUMNS if c != "reason") + "\n")},
        "bom.csv: results schema differs from this attnbench (missing reason); re-run",
    ),
    # Issue 36: attnbench report, a folder missing, without its CSV, or with an empty table.
    (["report", "nope", "."], {}, "nope: no such folder; give the --out folder of `attnbench run"),
    (["report", ".", "."], {}, ". has no extrapolate.csv; give the --out folder of `attnbench"),
    (
        ["report", ".", "."],
        {
            "extrapolate.csv": "variant,kind,applied_to,mechanism,path,params,seed,train_len,"
            "eval_len,accuracy,status\n"
        },
        "extrapolate.csv has no rows: nothing to report",
    ),
    (["report", ".", ".", "--direction", "both"], {}, "--direction 'both': accepted: fwd, fwdbwd"),
    # Issue 63: no command writes over an input, or over results it did not make, unless told.
    (["compare", "r.csv", "r.csv", "--markdown", "r.csv"], {"r.csv": "x"}, "--markdown r.csv is "
     "the input r.csv; writing there would replace what this command reads"),
    (["export", "r.csv", "--to", "bencher", "--out", "r.csv", "--overwrite"], {"r.csv": "x"},
     "--out r.csv is the input r.csv"),
    (["run", "entropy", "--out", "e"], {"e/entropy.csv": "kept"},
     "--out e already holds entropy.csv; choose another folder or pass --overwrite"),
    (["run", "extrapolate", "--out", "x"], {"x/extrapolate.csv": "kept"},
     "--out x already holds extrapolate.csv"),
    (["show", "softmax", "--out", "p.png"], {"p.png": "kept"}, "--out p.png already exists"),
    # Issue 63: sizes no memory holds, before anything is allocated (the allocator's traceback).
    (["run", "extrapolate", "--d-model", "4000000", "--steps", "1"], {},
     "--d-model 4000000: model.d_model = 4000000: a training step holds at least"),
    (["run", "extrapolate", "--batch", "1000000000000", "--steps", "1"], {},
     "train.batch = 1000000000000: a training step holds at least"),
    (["run", "speed", "--suite", "big.toml"], {"big.toml": BIG_BATCH},
     "big.toml line 5: shape.batch = 1000000000000: q and the output of one case alone"),
    (["check", "gqa", "--param", "kv_heads=1000000000000"], {},
     "--param kv_heads=1000000000000: the dense float64 reference"),
    # Issue 63: the last tracebacks, and numbers without a finite range.
    (["run", "speed", "--threads", "99999999999999999999"], {}, "usable core"),
    (["run", "speed", "--threads", "1000"], {}, "--threads 1000: timing.threads = 1000: this "
     "machine has"),
    (["run", "extrapolate", "--lr", "1e308", "--steps", "1"], {},
     "--lr 1e+308: train.lr = 1e+308 is not accepted; accepted: a number > 0 and <= 1"),
    (["run", "speed", "--suite", "deep.toml"], {"deep.toml": DEEP},
     "deep.toml: tables and arrays nested deeper than 16 levels"),
    (["run", "speed", "--set", "timing.warmup_s=inf"], {},
     "timing.warmup_s = inf is not accepted; accepted: a number from 0 to 60"),
    (["compare", "a.csv", "b.csv", "--time-ratio", "inf"], {},
     "--time-ratio inf: accepted: a factor > 1 and <= 100"),
    (["compare", "a.csv", "b.csv", "--mem-tolerance-other", "nan"], {},
     "--mem-tolerance-other nan: accepted: a number from 0 to 10"),
    (["gate", "--base", ""], {}, "--base '': accepted: a git revision"),
]  # fmt: skip


def run_executable(args: list[str], cwd: Path, columns: int = 80) -> subprocess.CompletedProcess:
    """``attnbench ARGS`` (``python -m attnbench``: what the installed script runs, main())
    in ``cwd``, on a terminal ``columns`` wide as far as rich is concerned."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": str(columns)}
    return subprocess.run(
        [sys.executable, "-m", "attnbench", *args], cwd=cwd, capture_output=True, text=True,
        env=env, timeout=300,
    )  # fmt: skip


@pytest.mark.parametrize(("args", "files", "message"), BAD_INVOCATIONS)
def test_bad_invocations_of_the_executable(args, files, message, tmp_path):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text, encoding="utf-8")
    before = {p: p.read_bytes() if p.is_file() else None for p in tmp_path.rglob("*")}
    done = run_executable(args, tmp_path)
    assert done.returncode == 2, (done.stdout, done.stderr)
    errors = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and message in errors[0], done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    after = {p: p.read_bytes() if p.is_file() else None for p in tmp_path.rglob("*")}
    assert after == before  # nothing written


def test_cli_usage_error_exit_code():
    result = runner.invoke(app, ["list", "--format", "xml"])
    assert result.exit_code == 2
