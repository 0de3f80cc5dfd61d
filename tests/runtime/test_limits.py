"""Issue 63: absurd sizes refused before anything is allocated, with the size asked and what this
machine has; threads beyond its cores; numbers outside a finite, sane range (stated in --help);
a config nested thousands deep; and messages that name the real problem (a checkpoint that cannot
be read, a file where a folder should be, a read-only file system). In this process; the
executable's own exit path is in tests/cli/test_errors.py."""

from __future__ import annotations

import errno
import os
import re
import typing

import pytest
import torch
from typer.testing import CliRunner

from attnbench.bench.config import load_suite, override
from attnbench.cli import app
from attnbench.cli.common import os_error_line
from attnbench.core.errors import AttnbenchError
from attnbench.extrapolation.experiment.config import load_preset
from attnbench.extrapolation.training.checkpoints import CHECKPOINT_FORMAT, load_checkpoint
from attnbench.measure import machine
from attnbench.runtime import outputs
from attnbench.runtime.outputs import ensure_dir, os_error_words
from attnbench.runtime.tomlconfig import Setting, load, parse_settings

runner = CliRunner()
GIB = 2**30


def one_line(args: list[str]) -> str:
    done = runner.invoke(app, args)
    lines = done.stderr.strip().splitlines()
    assert done.exit_code == 2 and len(lines) == 1, done.output
    assert "Traceback" not in done.output
    return lines[0]


# --------------------------------------------------------------------------------------------
# Sizes against memory
# --------------------------------------------------------------------------------------------


def test_too_big_names_the_size_furthest_above_its_default_and_what_fits():
    def need(s):
        return 8.0 * s["--heads"] * s["--n"] ** 2

    sizes, defaults = {"--n": 64, "--heads": 10**9}, {"--n": 64, "--heads": 4}
    name, line = machine.too_big(sizes, need, "scores", defaults, memory=GIB)
    fits = int(0.8 * GIB / (8 * 64**2))
    assert name == "--heads"
    assert line == (
        f"--heads 1000000000: scores, about 29.8 TiB, and this machine has 1.0 GiB available; "
        f"accepted here: --heads up to about {fits}"
    )
    assert machine.too_big({"--n": 64, "--heads": 4}, need, "scores", defaults, GIB) is None
    # a size that cannot fit even at 1 (here --heads) is not the one to bring down
    name, _ = machine.too_big({"--n": 10**6, "--heads": 10**6}, need, "x", {"--n": 10**6}, GIB)
    assert name == "--n"
    assert machine.byte_size(3 * 2**40) == "3.0 TiB" and machine.byte_size(5e40).endswith("PiB")


def test_a_suite_whose_case_no_memory_holds_is_a_usage_error_not_an_oom_row(monkeypatch):
    monkeypatch.setattr(machine, "memory_bytes", lambda: 8 * GIB)
    with pytest.raises(AttnbenchError) as info:
        load_suite("ci", settings=parse_settings(["shape.batch=1000000000000"]))
    line = str(info.value)
    assert line.startswith("--set shape.batch=1000000000000: shape.batch = 1000000000000: q and ")
    assert "and this machine has 8.0 GiB of memory in all; accepted here: shape.batch up to " in (
        line
    )
    with pytest.raises(AttnbenchError, match=r"^--lengths 2147483647: grid.lengths = 21474836"):
        override(load_suite("ci"), lengths="2147483647")
    load_suite("ci", settings=parse_settings(["shape.batch=64"]))  # plausible: an oom is a row


def test_a_suite_file_with_an_impossible_batch_names_its_line(tmp_path, monkeypatch):
    monkeypatch.setattr(machine, "memory_bytes", lambda: 8 * GIB)
    path = tmp_path / "big.toml"
    path.write_text('[grid]\ndevice = "cpu"\nlengths = [1024]\n[shape]\nbatch = 1000000000000\n')
    with pytest.raises(AttnbenchError, match=rf"^{path} line 5: shape.batch = 1000000000000: "):
        load_suite(str(path))


@pytest.mark.parametrize(
    ("option", "value", "key"),
    [("--d-model", 4_000_000, "model.d_model"), ("--batch", 10**12, "train.batch"),
     ("--layers", 10**9, "model.layers"), ("--train-len", 10**11, "model.train_len")],
)  # fmt: skip
def test_a_model_no_memory_trains_is_refused_naming_the_option(option, value, key):
    with pytest.raises(AttnbenchError) as info:
        load_preset("cpu", [Setting(tuple(key.split(".")), value, f"{option} {value}")])
    line = str(info.value)
    assert line.startswith(f"{option} {value}: {key} = {value}: a training step holds at least")
    assert "and this machine has" in line and f"available; accepted here: {key} up to about" in line
    load_preset("paper")  # the published size is not refused


def test_check_refuses_inputs_a_parameter_makes_too_big():
    for mechanism, param in (("gqa", "kv_heads"), ("gau", "expansion"), ("aft-local", "s")):
        line = one_line(["check", mechanism, "--param", f"{param}=1000000000000"])
        assert line.startswith(f"error: --param {param}=1000000000000: the dense float64 "), line
        assert f"accepted here: --param {param} up to about" in line
    line = one_line(["check", "softmax", "--head-dim", "99999999999"])
    assert line.startswith("error: --head-dim 99999999999:") and "--head-dim up to about" in line
    assert "--seed" in one_line(["check", "softmax", "--seed", str(2**70)])


def test_a_local_window_beyond_n_is_the_dense_band_not_an_allocation():
    pytest.importorskip("local_attention")
    args = ["check", "local", "--path", "local-attention", "--n", "33", "--param"]
    for causal in ("--no-causal", "--causal"):
        done = runner.invoke(app, [*args, "window=1000000000000", causal])
        assert done.exit_code == 0, done.output  # every tensor within tolerance of the reference


# --------------------------------------------------------------------------------------------
# Threads and numbers
# --------------------------------------------------------------------------------------------


def test_threads_beyond_the_cores_are_refused_with_the_core_count(monkeypatch):
    monkeypatch.setattr(machine, "usable_cores", lambda: 2)
    expected = "this machine has 2 usable cores; accepted here: 0 (one thread per core) to 2"
    with pytest.raises(AttnbenchError) as info:
        override(load_suite("ci"), threads=1000)
    assert str(info.value) == f"--threads 1000: timing.threads = 1000: {expected}"
    with pytest.raises(AttnbenchError, match=rf"timing.threads = 3: {re.escape(expected)}"):
        load_suite("ci", settings=parse_settings(["timing.threads=3"]))
    with pytest.raises(AttnbenchError) as info:
        load_preset("cpu", [Setting(("run", "threads"), 3, "--threads 3")])
    assert str(info.value) == f"--threads 3: run.threads = 3: {expected}"
    huge = str(10**20)
    with pytest.raises(AttnbenchError, match=r"a 64-bit integer"):
        load_preset("cpu", [Setting(("run", "threads"), 10**20, f"--threads {huge}")])
    override(load_suite("ci"), threads=2)


@pytest.mark.parametrize(
    ("setting", "words"),
    [
        ("timing.warmup_s=inf", "timing.warmup_s = inf is not accepted; accepted: a number from 0"),
        ("timing.group_budget_s=nan", "group_budget_s = nan is not accepted; accepted: a number"),
        ("timing.rounds=99999999999999999999", "from 1 to 10000 (a 64-bit integer: below 2**63)"),
        ("limits.max_call_s=1e30", "max_call_s = 1e+30 is not accepted"),
    ],
)
def test_suite_numbers_have_a_finite_range(setting, words):
    with pytest.raises(AttnbenchError, match=re.escape(words)):
        load_suite("ci", settings=parse_settings([setting]))


@pytest.mark.parametrize(
    ("option", "value", "words"),
    [
        ("--time-ratio", "inf", "--time-ratio inf: accepted: a factor > 1 and <= 100"),
        ("--min-effect", "1e9", "--min-effect 1000000000.0: accepted: a factor > 1 and <= 100"),
        ("--mem-tolerance-other", "nan", "--mem-tolerance-other nan: accepted: a number from 0"),
        ("--mem-slack", str(10**23), "--mem-slack 100000000000000000000000: accepted: a number"),
    ],
)
def test_compare_thresholds_have_a_finite_range(option, value, words):
    assert words in one_line(["compare", "a.csv", "b.csv", option, value])


def test_extrapolation_numbers_beyond_64_bits_or_float32_are_refused():
    with pytest.raises(AttnbenchError, match=r"^--lr 1e308: train.lr = 1e\+308 is not accepted; "
                       r"accepted: a number > 0 and <= 1$"):  # fmt: skip
        load_preset("cpu", [Setting(("train", "lr"), 1e308, "--lr 1e308")])
    with pytest.raises(AttnbenchError, match=r"train.steps = 99999999999999999999 .* 64-bit"):
        load_preset("cpu", parse_settings(["train.steps=99999999999999999999"]))


def numeric_options() -> list[tuple[str, str, str]]:
    """(command, option, its help) for every int or float option of every command."""
    found = []
    groups = [c for g in app.registered_groups for c in g.typer_instance.registered_commands]
    for info in [*app.registered_commands, *groups]:
        hints = typing.get_type_hints(info.callback, include_extras=True)
        for name, hint in hints.items():
            if typing.get_origin(hint) is not typing.Annotated:
                continue
            base, *meta = typing.get_args(hint)
            kinds = [k for k in (typing.get_args(base) or (base,)) if k is not type(None)]
            if kinds and kinds[0] in (int, float):
                option = next(m for m in meta if hasattr(m, "param_decls"))
                flag = next((d for d in option.param_decls if d.startswith("--")), None)
                bounds = " ".join(  # Typer's own min/max, shown in the help as [x>=1]
                    f"{word} {value}"
                    for word, value in ((">=", option.min), ("<=", option.max))
                    if value is not None
                )
                flag = flag or "--" + name.replace("_", "-")
                found.append((info.name, flag, f"{option.help or ''} {bounds}".strip()))
    return found


RANGE = re.compile(r">= ?-?\d|<= ?\d|> \d|< \d|\bfrom -?\d+ to\b|\b\d+ to \d|\bin [(\[]|up to")


def test_every_numeric_option_states_its_range_in_help():
    options = numeric_options()
    assert len(options) >= 30
    for command, flag, help_text in options:
        assert RANGE.search(help_text), (command, flag, help_text)


def test_the_extrapolation_options_state_the_schemas_own_range():
    """--d-model and the others set a preset key: their help says what the key's rule says."""
    from attnbench.cli.extrapolate import CONFIG_FIELDS
    from attnbench.extrapolation.experiment.config import PresetFile
    from attnbench.runtime.schema import Rule, keys

    rules = {".".join(key): f.metadata.get("valid") for key, f in keys(PresetFile)}
    helps = {flag: text for command, flag, text in numeric_options() if command == "extrapolate"}
    for name, key in CONFIG_FIELDS.items():
        flag = "--" + name.replace("_", "-")
        if flag in helps and isinstance(rules[key], Rule):
            words = rules[key].words.removesuffix(" and finite")
            assert words in helps[flag], (flag, words, helps[flag])


# --------------------------------------------------------------------------------------------
# A config nested thousands deep
# --------------------------------------------------------------------------------------------


def test_a_config_nested_thousands_deep_is_one_line(tmp_path):
    for depth in (5000, 40):  # tomllib's recursion gives out; deep enough to be no config
        path = tmp_path / f"deep{depth}.toml"
        path.write_text("x = " + "[" * depth + "]" * depth + "\n")
        with pytest.raises(AttnbenchError) as info:
            load(path)
        assert str(info.value) == (
            f"{path}: tables and arrays nested deeper than 16 levels; a suite file is sections "
            "of keys, each a value, a list or a small table"
        )
    deep = "[" * 3000 + "]" * 3000
    with pytest.raises(AttnbenchError) as info:
        load_suite("ci", settings=parse_settings([f"grid.lengths={deep}"]))
    line = str(info.value)
    assert line.startswith("--set grid.lengths=[[[[[[") and len(line) < 300, line
    assert "... (6000 characters): grid.lengths = '[[[[" in line and "(6002 characters)" in line


# --------------------------------------------------------------------------------------------
# Messages that name the real problem
# --------------------------------------------------------------------------------------------


@pytest.fixture
def checkpoint_bytes(tmp_path) -> bytes:
    path = tmp_path / "whole.pt"
    torch.save({"format": CHECKPOINT_FORMAT, "w": torch.zeros(256)}, path)
    return path.read_bytes()


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda whole: whole[: len(whole) // 2], "it is truncated ("),
        (lambda whole: b"", "it is empty"),
        (lambda whole: b"step,loss\n1,2.5\n", "it is a text file, not a checkpoint"),
        (lambda whole: bytes(range(64)), "it is not a torch file (it begins with bytes 00 01"),
    ],
)
def test_an_unreadable_checkpoint_says_why(tmp_path, checkpoint_bytes, make, words):
    path = tmp_path / "E-seed0.pt"
    path.write_bytes(make(checkpoint_bytes))
    with pytest.raises(AttnbenchError) as info:
        load_checkpoint(path)
    assert str(info.value).startswith(f"cannot read checkpoint {path}: {words}"), info.value


def test_a_checkpoint_of_another_version_or_kind_says_so(tmp_path):
    path = tmp_path / "E-seed0.pt"
    torch.save({"format": CHECKPOINT_FORMAT + 1}, path)
    with pytest.raises(AttnbenchError, match=r"was written by another version of attnbench \("):
        load_checkpoint(path)
    torch.save([1, 2], path)
    with pytest.raises(AttnbenchError, match=r"not an attnbench .* \(a torch file holding a list"):
        load_checkpoint(path)


def test_a_file_in_the_way_of_a_folder_is_named(tmp_path):
    (tmp_path / "afile").write_text("x")
    exists = FileExistsError(errno.EEXIST, "File exists", str(tmp_path / "afile"))
    assert os_error_words(exists) == "it is a file, not a folder"
    below = NotADirectoryError(errno.ENOTDIR, "Not a directory", str(tmp_path / "afile" / "x"))
    assert os_error_line(below) == f"{tmp_path}/afile/x: {tmp_path}/afile is a file, not a folder"
    line = one_line(["export", "r.csv", "--to", "bencher", "--out", str(tmp_path / "afile/x.json")])
    assert line == f"error: cannot use {tmp_path}/afile as the folder for --out: it is a file"


class _Statvfs:
    def __init__(self, flag: int) -> None:
        self.f_flag = flag


def test_a_read_only_file_system_is_not_called_permission_denied(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "access", lambda *a, **k: False)
    monkeypatch.setattr(os, "statvfs", lambda path: _Statvfs(os.ST_RDONLY))
    with pytest.raises(AttnbenchError, match=r"it is on a read-only file system$"):
        ensure_dir(tmp_path / "out")
    with pytest.raises(AttnbenchError, match=rf"{tmp_path} is on a read-only file system$"):
        ensure_dir(tmp_path / "other", create=False)
    denied = PermissionError(errno.EACCES, "Permission denied", str(tmp_path / "x.csv"))
    assert os_error_words(denied) == f"{tmp_path} is on a read-only file system"
    monkeypatch.setattr(os, "statvfs", lambda path: _Statvfs(0))
    assert os_error_words(denied) == "Permission denied"
    assert outputs.unwritable(tmp_path) == "is not writable by this user (permission denied)"
