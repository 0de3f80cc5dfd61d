"""Bad input: one line saying what is wrong and what is accepted; ValueError from Python, exit 2
and no traceback from the CLI."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from attnbench import registry
from attnbench.api import attention, parse_impl
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


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["check", "softmx"], "unknown mechanism 'softmx'"),
        (["check", "softmax-logn", "--param", "base=0.5"], "invalid base"),
        (["check", "softmax-logn", "--param", "base"], "is not NAME=VALUE"),
        (["check", "gqa", "--heads", "3"], "does not divide"),
        (["check", "softmax", "--path", "fused"], "has no path 'fused'"),
        (["check", "softmax", "--param", "tile=3"], "takes no parameters"),
        (["list", "--family", "nope"], "unknown family"),
        (["list", "--format", "xml"], "--format 'xml': accepted: table, json, csv"),
        (["list", "-f", "xml"], "--format 'xml': accepted: table, json, csv"),
        (["check", "softmax", "--dtype", "half"], "unknown dtype 'half'; accepted: float64"),
        (["check", "softmax", "--device", "tpu"], "unknown device 'tpu'; accepted: cpu, cuda"),
        (["run", "speed", "--device", "tpu"], "--device 'tpu': accepted: auto, cpu, cuda"),
        (["plot", "r.csv", "--format", "jpg"], "--format 'jpg': accepted: png, svg"),
        (["export", "r.csv", "--to", "gh"], "unknown --to target 'gh'"),
        (["run", "speed", "--resume", "--overwrite"], "exclude each other"),
        (["compare", "a.csv", "b.csv", "--mem-tolerance", "nan"], "a finite number >= 0"),
        (["run", "extrapolate", "--lr", "inf", "--steps", "1"], "--lr inf: train.lr = inf is not"),
        (["run", "extrapolate", "--lr", "nan", "--steps", "1"], "--lr nan: train.lr = nan is not"),
        (["run", "extrapolate", "--set", "train.grad_clip=nan"], "grad_clip = nan is not"),
    ],
)
def test_cli_errors(args, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # nothing may be written, and nothing is
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert "Traceback" not in result.output
    assert not any(tmp_path.iterdir()), list(tmp_path.iterdir())


def test_cli_usage_error_exit_code():
    result = runner.invoke(app, ["list", "--format", "xml"])
    assert result.exit_code == 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "error: no command given; accepted: list, check, show, plot, compare, export"),
        (["run"], "error: no command given; accepted: speed, extrapolate, entropy"),
        (["nosuch"], "No such command 'nosuch'; accepted: list, check"),
        (["run", "nosuch"], "No such command 'nosuch'; accepted: speed, extrapolate, entropy"),
    ],
)
def test_the_executable_names_the_commands_a_group_accepts(args, message, tmp_path):
    """Through the real executable (``main``): a group without a command, or with an unknown
    one, ends in one line that lists its commands (click's own message is empty or names none)."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "attnbench", *args], cwd=tmp_path, capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    errors = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and message in errors[0], done.stderr
    assert "Traceback" not in done.stderr and not any(tmp_path.iterdir())
