"""``run speed --resume`` continues a run only with the settings it was started with (issue 63):
another suite, other timing or another shape is refused, naming the keys that differ, before
anything is written, as a resumed training of ``run extrapolate`` is; the same settings resume.
The unit-wise plan of another sweep names its keys too."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from attnbench.bench.results import read_results
from attnbench.bench.run import run_speed
from attnbench.bench.units import plan_document, speed_units, write_plan
from attnbench.core.errors import AttnbenchError
from attnbench.runtime.schema import key_difference
from attnbench.variants import softmax
from tests.helpers.speed import FAST, tiny

MECHS = [softmax.MECHANISM]


@pytest.fixture(scope="module")
def first(tmp_path_factory):
    """A finished tiny run (one length) to resume into; its folder."""
    out = tmp_path_factory.mktemp("run")
    run_speed(tiny(lengths=(16,), causal=(False,), directions=("fwd",)), out, mechanisms=MECHS)
    return out


def files(folder):
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


@pytest.mark.parametrize(
    ("changes", "said"),
    [
        ({"name": "other"}, "name 'tiny' -> 'other'"),
        ({"timing": replace(FAST, rounds=3, min_rounds=3)}, "min_rounds 2 -> 3, rounds 2 -> 3"),
        ({"heads": 4}, "heads 2 -> 4"),
        ({"dtypes": ("float64",)}, "dtypes ['float32'] -> ['float64']"),
    ],
)
def test_resume_refuses_other_settings_and_names_the_keys(first, changes, said):
    before = files(first)
    suite = tiny(lengths=(16,), causal=(False,), directions=("fwd",), **changes)
    with pytest.raises(AttnbenchError) as info:
        run_speed(suite, first, mechanisms=MECHS, resume=True)
    line = str(info.value)
    assert line.startswith(f"--resume: {first} holds a run with other settings (") and said in line
    assert (
        "resume with the same suite and options, or choose another --out" in line
        and "\n" not in line
    )
    assert files(first) == before  # nothing written, not even the sidecar


def test_resume_with_the_same_settings_continues(first, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    for name, data in files(first).items():
        (out / name).write_bytes(data)
    suite = tiny(lengths=(16,), causal=(False,), directions=("fwd",))  # the first run's
    run = run_speed(suite, out, mechanisms=MECHS, resume=True)
    assert json.loads(run.sidecar.read_text())["resumed_with_rows"] == len(read_results(run.csv))


def test_resume_without_a_sidecar_still_refuses_another_suites_rows(first, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "results.csv").write_bytes((first / "results.csv").read_bytes())
    suite = tiny(name="other", lengths=(16,), causal=(False,), directions=("fwd",))
    with pytest.raises(AttnbenchError, match=r"name 'tiny' -> 'other'"):
        run_speed(suite, out, mechanisms=MECHS, resume=True)


def test_key_difference_walks_tables_and_names_missing_keys():
    saved = {"name": "ci", "timing": {"rounds": 9, "clock": "cpu"}, "old": 1}
    wanted = {"name": "ci", "timing": {"rounds": 5, "clock": "cpu"}, "new": [1]}
    assert key_difference(saved, wanted) == "new None -> [1], old 1 -> None, rounds 9 -> 5"
    assert key_difference(saved, saved) == ""


def test_a_unit_wise_plan_of_another_sweep_names_the_keys(tmp_path):
    a, b = tiny(), tiny(timing=replace(FAST, rounds=4))
    write_plan(tmp_path, plan_document(a, speed_units(a), ["softmax"]))
    with pytest.raises(AttnbenchError, match=r"holds the plan of another sweep \(rounds 2 -> 4\)"):
        write_plan(tmp_path, plan_document(b, speed_units(b), ["softmax"]))
