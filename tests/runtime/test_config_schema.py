"""The one schema language of config files (:mod:`attnbench.runtime.schema`): dataclasses read
from TOML by their type hints, errors naming the file, line and key, and ``--set
SECTION.FIELD=VALUE`` merged over a file before it is checked, the same for ``run speed`` and
``run extrapolate``."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest
from typer.testing import CliRunner

from attnbench.core.errors import AttnbenchError
from attnbench.runtime.schema import (
    Checked,
    Invalid,
    at_least,
    finite,
    inside,
    keys,
    read_section,
    setting,
)
from attnbench.runtime.tomlconfig import SuiteText, load, parse_settings
from tests.helpers.speed import tiny_suite_file

runner = CliRunner()


@dataclass(frozen=True)
class Inner(Checked):
    low: int = setting(1, "the low end", valid=at_least(0))
    high: int = setting(2, "the high end", valid=at_least(0))

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.low > self.high:
            raise Invalid("high", f"high = {self.high} is below low = {self.low}")


@dataclass(frozen=True)
class Item(Checked):
    kind: str = setting(doc="required: no default")
    size: int | None = setting(None, "optional")


@dataclass(frozen=True)
class Example(Checked):
    name: str = setting("", "a string")
    count: int = setting(3, "an integer", valid=at_least(1))
    rate: float = setting(0.5, "a number", valid=inside(0, 1))
    lr: float = setting(1e-3, "finite and positive", valid=finite(at_least(0)))
    flag: bool = setting(False, "true or false")
    mode: Literal["fast", "slow"] = setting("fast", "a choice")
    lengths: tuple[int, ...] = setting((8,), "a list", valid=at_least(1), non_empty=True)
    tags: list[str] = setting([], "a list of strings")
    modes: tuple[Literal["fast", "slow"], ...] = setting(("fast",), "choices")
    caps: dict[str, int] = setting({}, "a table of integers", valid=at_least(1))
    device: str | None = setting(None, "optional")
    extra: Any = setting(None, "anything")
    inner: Inner = setting(Inner, "a sub-table")
    items: dict[str, Item] = setting({}, "named sub-tables [items.NAME]")


def text_of(tmp_path: Path, toml: str) -> SuiteText:
    path = tmp_path / "mine.toml"
    path.write_text(toml)
    return load(path)


def read(tmp_path: Path, toml: str, settings: list[str] | None = None) -> Example:
    text = text_of(tmp_path, toml).with_settings(parse_settings(settings))
    return read_section(text, text.data, Example)


def error(tmp_path: Path, toml: str, settings: list[str] | None = None) -> str:
    with pytest.raises(AttnbenchError) as info:
        read(tmp_path, toml, settings)
    message = str(info.value)
    assert "\n" not in message
    return message


# --------------------------------------------------------------------------------------------
# Reading a file
# --------------------------------------------------------------------------------------------


def test_every_type_is_read_and_converted(tmp_path):
    ex = read(
        tmp_path,
        'name = "x"\ncount = 4\nlr = 1\nflag = true\nmode = "slow"\nlengths = [16, 8]\n'
        'tags = ["a"]\nmodes = ["slow", "fast"]\ncaps = { a = 2 }\ndevice = "cpu"\n'
        'extra = [1, "two"]\n[inner]\nlow = 0\n[items.first]\nkind = "k"\nsize = 3\n',
    )
    assert (ex.name, ex.count, ex.flag, ex.mode, ex.device) == ("x", 4, True, "slow", "cpu")
    assert ex.lr == 1.0 and isinstance(ex.lr, float)  # an integer is a number
    assert ex.lengths == (16, 8) and ex.tags == ["a"] and ex.modes == ("slow", "fast")
    assert ex.caps == {"a": 2} and ex.extra == [1, "two"]
    assert ex.inner == Inner(low=0, high=2) and ex.items == {"first": Item("k", 3)}


def test_defaults_fill_missing_keys(tmp_path):
    assert read(tmp_path, "") == Example()
    assert Example().tags == [] and Example().tags is not Example().tags  # a fresh list each


@pytest.mark.parametrize(
    ("toml", "line", "words"),
    [
        ('\n\ncount = "3"\n', 3, ["count = '3' is not accepted", "accepted: an integer >= 1"]),
        ("count = 0\n", 1, ["count = 0", "an integer >= 1"]),
        ("count = 2.0\n", 1, ["count = 2.0", "an integer"]),
        ("count = true\n", 1, ["count = True", "an integer"]),
        ("rate = 1\n", 1, ["rate = 1", "a number in (0, 1)"]),
        ("lr = inf\n", 1, ["lr = inf", "a number >= 0 and finite"]),
        ('flag = "yes"\n', 1, ["flag = 'yes'", "true or false"]),
        ('mode = "medium"\n', 1, ["mode = 'medium'", "accepted: fast, slow"]),
        ("lengths = []\n", 1, ["lengths = []", "a non-empty list of integers >= 1"]),
        ("lengths = [8, 0]\n", 1, ["lengths = [8, 0]", ">= 1"]),
        ("lengths = 8\n", 1, ["lengths = 8", "a non-empty list of integers"]),
        ('modes = ["fast", "medium"]\n', 1, ["modes = ['fast', 'medium']", "a list from fast"]),
        ("caps = { a = 1, b = 0 }\n", 1, ["caps = {'a': 1, 'b': 0}", "a table of integers >= 1"]),
        ("count = 1\n[inner]\nlow = -1\n", 3, ["inner.low = -1", "an integer >= 0"]),
        ("[inner]\nlow = 5\nhigh = 3\n", 3, ["[inner] high = 3 is below low = 5"]),
        ("[items.a]\nsize = 1\n", 1, ["[items.a] needs kind (a string)"]),
        ("[items.a]\nkind = 'k'\nsize = 'big'\n", 3, ["items.a.size = 'big'", "an integer"]),
        ("inner = 3\n", 1, ["inner = 3 is not accepted; accepted: a table"]),
    ],
)
def test_refused_values_name_file_line_key_and_what_is_accepted(tmp_path, toml, line, words):
    message = error(tmp_path, toml)
    assert message.startswith(f"{tmp_path / 'mine.toml'} line {line}: "), message
    for word in words:
        assert word in message, message


def test_unknown_keys_and_sections_suggest_the_closest(tmp_path):
    message = error(tmp_path, "count = 1\n\n[inner]\nlwo = 1\n")
    assert "mine.toml line 4: unknown key 'inner.lwo' (did you mean 'inner.low'?)" in message
    assert "known: inner.low, inner.high" in message
    message = error(tmp_path, "[iner]\nlow = 1\n")
    assert "line 1: unknown section [iner] (did you mean [inner]?)" in message
    assert "[items.NAME]" in message
    assert "unknown key 'cuont' (did you mean 'count'?)" in error(tmp_path, "cuont = 1\n")


def test_a_dataclass_made_in_code_is_checked_too():
    with pytest.raises(Invalid, match=r"count = 0 is not accepted; accepted: an integer >= 1"):
        Example(count=0)
    with pytest.raises(Invalid) as info:
        Inner(low=3, high=1)
    assert info.value.field == "high"
    with pytest.raises(TypeError, match="needs accepted"):
        setting(1, valid=lambda x: x > 0)


def test_keys_lists_every_key_of_the_schema_and_its_tables():
    names = [".".join(k) for k, _ in keys(Example)]
    assert "count" in names and "inner.low" in names and "inner.high" in names
    assert "items" in names and "inner" not in names  # a sub-table is walked into
    assert dict((".".join(k), f.metadata["doc"]) for k, f in keys(Example))["count"] == (
        "an integer"
    )


# --------------------------------------------------------------------------------------------
# --set SECTION.FIELD=VALUE
# --------------------------------------------------------------------------------------------


def test_set_values_are_read_by_the_field_type(tmp_path):
    ex = read(
        tmp_path,
        "count = 1\n[inner]\nhigh = 9\n",
        [
            "count=5",
            "rate=3e-1",
            "flag=true",
            "mode=slow",
            "name=cuda:1",  # a string needs no quotes
            'device="a b"',  # ... and may have them
            "lengths=64,16",  # a list, comma-separated
            'tags=["x", "y"]',  # ... or as TOML
            "modes=none",  # the empty list
            "caps={ a = 3 }",
            "inner.low=2",
            "items.new.kind=k",  # a table the file does not have
        ],
    )
    assert (ex.count, ex.rate, ex.flag, ex.mode, ex.name) == (5, 0.3, True, "slow", "cuda:1")
    assert ex.device == "a b" and ex.lengths == (64, 16) and ex.tags == ["x", "y"]
    assert ex.modes == () and ex.caps == {"a": 3} and ex.inner == Inner(2, 9)
    assert ex.items == {"new": Item("k")}
    assert read(tmp_path, "count = 1\n", ["count=2", "count=7"]).count == 7  # the last wins


@pytest.mark.parametrize(
    ("settings", "expect"),
    [
        (["count=0"], "--set count=0: count = 0 is not accepted; accepted: an integer >= 1"),
        (["count=abc"], "--set count=abc: count = 'abc' is not accepted"),
        (["lengths=8,x"], "--set lengths=8,x: lengths = [8, 'x'] is not accepted"),
        (["inner.lwo=1"], "--set inner.lwo=1: unknown key 'inner.lwo' (did you mean 'inner.low'?)"),
        (["inner.low=5", "inner.high=3"], "--set inner.high=3: [inner] high = 3 is below low"),
        (["items.a.size=1"], "--set items.a.size=1: [items.a] needs kind"),
        (["count"], "--set 'count' is not SECTION.FIELD=VALUE (e.g. --set timing.rounds=5)"),
        (["=1"], "is not SECTION.FIELD=VALUE"),
        (["inner..low=1"], "is not SECTION.FIELD=VALUE"),
        (["count.x=1"], "--set count.x=1: count is not a table"),
    ],
)
def test_a_bad_set_names_the_option_not_a_line(tmp_path, settings, expect):
    message = error(tmp_path, "count = 1\n", settings)
    assert expect in message, message
    assert "mine.toml" not in message


def test_settings_merge_before_the_check_and_keep_the_file_lines(tmp_path):
    text = text_of(tmp_path, "name = 'x'\n[inner]\nlow = 1\nhigh = 'two'\n")
    merged = text.with_settings(parse_settings(["inner.low=0"]))
    assert merged.data["inner"] == {"low": "0", "high": "two"} and text.data["inner"]["low"] == 1
    with pytest.raises(AttnbenchError, match=r"mine.toml line 4: inner.high = 'two'"):
        read_section(merged, merged.data, Example)  # a file mistake still names its line


# --------------------------------------------------------------------------------------------
# Both commands
# --------------------------------------------------------------------------------------------

#: The tiny suite (tests/fixtures) cut to softmax's efficient path at n = 16, no reference.
ONE_EFFICIENT_PATH = dict(
    top={"name": None},
    grid={"mechanisms": ["softmax"], "path_kinds": ["efficient"], "lengths": [16], "reference": ""},
    timing={"min_rounds": 1},
)


def test_run_speed_set_changes_the_suite_before_it_is_checked(tmp_path):
    from attnbench.bench.config import load_suite

    suite_file = tiny_suite_file(tmp_path, **ONE_EFFICIENT_PATH)
    suite = load_suite(
        str(suite_file), settings=parse_settings(["grid.lengths=32,64", "timing.rounds=3"])
    )
    assert suite.lengths == (32, 64) and suite.timing.rounds == 3
    out = tmp_path / "out"
    args = ["run", "speed", "--suite", str(suite_file), "--out", str(out), "--no-plot"]
    sets = ["--set", "grid.lengths=[24]", "--set", "timing.rounds=1", "--set", "grid.causal=true"]
    result = runner.invoke(_app(), [*args, *sets, "--format", "json"])
    assert result.exit_code == 0, result.output
    sidecar = json.loads((out / "results.json").read_text())
    settings = json.dumps(sidecar)
    assert '"lengths": [24]' in settings and '"rounds": 1' in settings, settings
    assert '"causal": [true]' in settings


@pytest.mark.parametrize(
    ("sets", "expect"),
    [
        (["timing.rounds=0"], "--set timing.rounds=0: timing.rounds = 0 is not accepted"),
        (["timing.roundz=2"], "unknown key 'timing.roundz' (did you mean 'timing.rounds'"),
        (["grid.dtypes=fp8"], "grid.dtypes = ['fp8'] is not accepted; accepted: a non-empty"),
        (["params.softmax-logn.base=0.5"], "--set params.softmax-logn.base=0.5: [params.softmax"),
        (["timing.min_rounds=3"], "--set timing.min_rounds=3: [timing] min_rounds = 3 exceeds"),
        (["rounds"], "--set 'rounds' is not SECTION.FIELD=VALUE"),
    ],
)
def test_run_speed_bad_set_is_one_line_naming_it(tmp_path, sets, expect):
    suite_file = tiny_suite_file(tmp_path, **ONE_EFFICIENT_PATH)
    args = ["run", "speed", "--suite", str(suite_file), "--out", str(tmp_path / "out")]
    result = runner.invoke(_app(), [*args, *(a for s in sets for a in ("--set", s))])
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert expect in lines[0], lines[0]
    assert not (tmp_path / "out").exists()


def test_run_speed_help_lists_the_sections_of_set():
    result = runner.invoke(_app(), ["run", "speed", "--help"], env={"COLUMNS": "300"})
    assert result.exit_code == 0
    assert "grid, shape, limits, timing, profile, params.NAME" in " ".join(result.output.split())


def test_run_extrapolate_options_and_set_share_one_path():
    """The options that set one field and --set both become settings over the preset: checked
    by the same schema, the error naming the option; --set wins."""
    from attnbench.cli.extrapolate import CONFIG_FIELDS, _config
    from attnbench.extrapolation.experiment.config import load_preset

    params = dict.fromkeys(CONFIG_FIELDS) | {"steps": 5, "eval_lengths": "16,32"}
    cfg = _config("cpu", params, ["train.steps=7", 'run.variants=["O"]', "lr=3e-4"])
    assert (cfg.train.steps, cfg.train.lr, cfg.eval.lengths, cfg.run.variants) == (
        7, 3e-4, (16, 32), ("O",)
    )  # fmt: skip
    assert load_preset("cpu", parse_settings(["run.device=cuda:1"])).run.device == "cuda:1"
    with pytest.raises(AttnbenchError, match=r"^--eval-lengths 0: eval.lengths = \[0\] is not"):
        _config("cpu", params | {"eval_lengths": "0"}, None)
    with pytest.raises(AttnbenchError, match=r"^--set train.lr=-1: train.lr = -1 is not accepted"):
        _config("cpu", params, ["train.lr=-1"])


def test_extrapolation_sections_check_themselves():
    from attnbench.extrapolation.experiment.config import EvalConfig, RunConfig, load_preset
    from attnbench.extrapolation.model.encoder import ModelConfig
    from attnbench.extrapolation.training.options import TrainConfig

    with pytest.raises(Invalid, match="not divisible by heads = 3"):
        ModelConfig(d_model=128, heads=3)
    with pytest.raises(Invalid, match="lr = nan is not accepted"):
        TrainConfig(lr=float("nan"))
    with pytest.raises(Invalid, match="lengths = \\(\\) is not accepted"):
        EvalConfig(lengths=())
    with pytest.raises(Invalid, match="accepted: auto, cpu, cuda, cuda:N, mps"):
        RunConfig(device="tpu")
    cfg = load_preset("cpu")
    assert cfg.override({"steps": "9", "run.eval_time": "none"}).train.steps == 9
    with pytest.raises(AttnbenchError, match=r"^heldout_every=-1: run.heldout_every = -1"):
        cfg.override({"heldout_every": -1})


def _app():
    from attnbench.cli import app

    return app
