"""A speed sweep cut into units: shards, resume, crash isolation, merge, and Ray (CPU only)."""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import replace

import pandas as pd
import pytest
from typer.testing import CliRunner

from attnbench.bench.merge import merge_runs
from attnbench.bench.results import KEY
from attnbench.bench.run import run_speed
from attnbench.bench.sweep import plan_sweep, run_sweep
from attnbench.bench.units import speed_units, unit_dir
from attnbench.cli import app
from attnbench.core.errors import AttnbenchError
from attnbench.runtime.engines import FAULT_ENV, FAULT_EXIT, parse_shard
from tests.helpers.speed import tiny, tiny_suite_file

runner = CliRunner()

#: Two mechanisms besides the reference, both causal flags: 6 units of 2 lengths x 2 directions.
SUITE = tiny(mechanisms=("softmax", "linear", "local"))
COMPARED = [*KEY, "status", "flops", "flops_method", "reference"]


def compared(df: pd.DataFrame) -> list[list[str]]:
    return df[COMPARED].fillna("").astype(str).values.tolist()


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    out = tmp_path_factory.mktemp("single")
    run_speed(SUITE, out)
    return pd.read_csv(out / "results.csv")


def test_units_are_stable_and_shards_partition_them():
    units = speed_units(SUITE)
    assert [u.id for u in units] == [u.id for u in speed_units(SUITE)]
    assert len({u.id for u in units}) == len(units) == 6
    assert units[0].id == "cpu-float32-d8-bidir-softmax"
    for n in (1, 2, 4, 7):
        shards = [[u.id for u in units if u.index % n == i] for i in range(n)]
        assert sorted(sum(shards, [])) == sorted(u.id for u in units)
    # every case of the plan belongs to exactly one unit
    orders = sorted(c["order"] for u in units for c in u.cases)
    assert orders == list(range(len(orders)))


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """Shards 0/2 and 1/2 of SUITE, each in its own folder (what two array tasks leave)."""
    root = tmp_path_factory.mktemp("shards")
    a = run_sweep(SUITE, root / "a", shard=(0, 2), log=lambda _: None)
    b = run_sweep(SUITE, root / "b", shard=(1, 2), log=lambda _: None)
    return root, a, b


def test_two_shards_merged_equal_a_single_run(tmp_path, shards, single):
    root, a, b = shards
    assert not a.complete and not b.complete and not a.failed and not b.failed
    assert {u.id for u in a.mine} | {u.id for u in b.mine} == {u.id for u in a.units}
    run = merge_runs([root / "b", root / "a"], tmp_path / "m")
    merged = pd.read_csv(run.csv)
    assert compared(merged) == compared(single)  # key columns, order, FLOPs and status
    ok = merged[merged["status"] == "ok"]
    assert ok["ref_ratio"].notna().all() and ok["roofline"].notna().all()
    side = json.loads(run.sidecar.read_text())
    assert {u["status"] for u in side["merged"]["units"]} == {"ok"}
    assert len(side["merged"]["units"]) == 6
    samples = (tmp_path / "m/samples.jsonl").read_text().splitlines()
    assert len(samples) == len(ok)
    assert pd.read_csv(tmp_path / "m/complexity.csv").shape[0] > 0


def test_resume_runs_only_the_missing_unit(tmp_path, shards, single):
    root, a, _ = shards
    out = tmp_path / "run"
    for shard in ("a", "b"):  # both shards' units in one folder: a whole run
        shutil.copytree(root / shard, out, dirs_exist_ok=True)
    gone = a.mine[1]
    shutil.rmtree(unit_dir(out, gone))
    with pytest.raises(AttnbenchError, match="--resume"):
        run_sweep(SUITE, out, log=lambda _: None)
    again = run_sweep(SUITE, out, resume=True, log=lambda _: None)
    assert list(again.records) == [gone.id]
    assert len(again.skipped) == 5 and again.complete
    assert compared(pd.read_csv(merge_runs([out], out).csv)) == compared(single)


def test_a_unit_that_kills_its_process_fails_alone_after_one_retry(tmp_path, monkeypatch):
    suite = replace(SUITE, mechanisms=("softmax", "linear"), causal=(False,))  # 2 units
    units = speed_units(suite)
    victim = units[-1]
    monkeypatch.setenv(FAULT_ENV, f"crash:{victim.id}")
    said = []
    outcome = run_sweep(suite, tmp_path, log=said.append)
    assert outcome.failed == [victim.id]
    rec = outcome.records[victim.id]
    assert rec["exit_code"] == FAULT_EXIT and rec["attempts"] == 2
    assert any("retrying once in a fresh process" in line for line in said)
    assert all(outcome.records[u.id]["status"] == "ok" for u in units if u is not victim)
    df = pd.read_csv(merge_runs([tmp_path], tmp_path).csv)
    mine = df[(df["mechanism"] == victim.mechanism) & (df["causal"] == victim.causal)]
    assert len(mine) == len(victim.cases) and set(mine["status"]) == {"error"}
    assert mine["reason"].str.contains(victim.id).all()
    assert mine["reason"].str.contains(f"code {FAULT_EXIT}").all()
    assert (df.drop(mine.index)["status"] != "error").all()
    # a crash on the first attempt only: the retry in a fresh process finishes the unit
    monkeypatch.setenv(FAULT_ENV, f"crash-once:{victim.id}")
    again = run_sweep(suite, tmp_path, resume=True, log=lambda _: None)
    assert list(again.records) == [victim.id] and not again.failed
    df = pd.read_csv(merge_runs([tmp_path], tmp_path).csv)
    assert (df["status"] != "error").all()


def test_a_unit_no_shard_ran_becomes_error_rows_naming_it(tmp_path, shards):
    root, a, b = shards
    df = pd.read_csv(merge_runs([root / "a"], tmp_path / "m").csv)
    for u in b.mine:
        rows = df[(df["mechanism"] == u.mechanism) & (df["causal"] == u.causal)]
        assert set(rows["status"]) == {"error"}
        assert rows["reason"].str.contains(f"unit {u.id} was not run").all()


def test_merge_refuses_other_suites_mixed_devices_and_extrapolation_folders(tmp_path, shards):
    root, _, _ = shards
    plan_sweep(replace(SUITE, name="other", lengths=(16,)), tmp_path / "other", None, False, False)
    with pytest.raises(AttnbenchError, match="different suites"):
        merge_runs([root / "a", tmp_path / "other"], tmp_path / "m")
    shutil.copytree(root / "b", tmp_path / "c")
    record = next((tmp_path / "c/units").glob("*/unit.json"))
    data = json.loads(record.read_text())
    record.write_text(json.dumps(data | {"device_name": "Another CPU"}))
    with pytest.raises(AttnbenchError, match="different device models"):
        merge_runs([root / "a", tmp_path / "c"], tmp_path / "m")
    run = merge_runs([root / "a", tmp_path / "c"], tmp_path / "m", allow_mixed=True)
    assert json.loads(run.sidecar.read_text())["merged"]["mixed"]
    (tmp_path / "x/checkpoints").mkdir(parents=True)
    with pytest.raises(AttnbenchError, match="extrapolation"):
        merge_runs([tmp_path / "x"], tmp_path / "m")
    (tmp_path / "empty").mkdir()
    with pytest.raises(AttnbenchError, match="plan.json"):
        merge_runs([tmp_path / "empty"], tmp_path / "m")


@pytest.mark.parametrize("text", ["3/2", "a/b", "1", "-1/2", "0/0", "1/"])
def test_bad_shard_specs(text):
    with pytest.raises(AttnbenchError, match="accepted: I/N"):
        parse_shard(text)
    res = runner.invoke(app, ["run", "speed", "--shard", text, "--out", "x"])
    assert res.exit_code == 2
    assert res.output.count("\n") == 1 and "I/N" in res.output


def test_cli_bad_executor_missing_ray_and_list_units(tmp_path, monkeypatch):
    res = runner.invoke(app, ["run", "speed", "--executor", "slurm", "--out", str(tmp_path)])
    assert res.exit_code == 2 and "accepted: local, ray" in res.output
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    res = runner.invoke(app, ["run", "speed", "--executor", "ray", "--out", str(tmp_path)])
    assert res.exit_code == 2 and 'pip install "attnbench[ray]"' in res.output
    res = runner.invoke(app, ["run", "speed", "--suite", "ci", "--list-units", "--format", "json",
                              "--shard", "1/4"])  # fmt: skip
    assert res.exit_code == 0, res.output
    listed = json.loads(res.output)
    assert listed and all(u["index"] % 4 == 1 and u["shard"] == 1 for u in listed)
    res = runner.invoke(app, ["merge", str(tmp_path / "nothing"), "--out", str(tmp_path / "m")])
    assert res.exit_code == 2 and res.output.count("\n") == 1


def test_ray_with_two_cpu_workers_equals_a_single_run(tmp_path, single):
    ray = pytest.importorskip("ray", reason="the ray extra is not installed")
    said = []
    try:
        outcome = run_sweep(replace(SUITE, threads=1), tmp_path, executor="ray", log=said.append)
    finally:
        ray.shutdown()
    assert outcome.complete and not outcome.failed, said
    assert any("done" in line and "running" in line for line in said)
    merged = pd.read_csv(merge_runs([tmp_path], tmp_path).csv)
    assert compared(merged) == compared(single)


def test_the_slurm_scripts_run_an_array_then_merge(tmp_path):
    """scripts/slurm/*.sbatch as SLURM runs them (bash, with the array's variables set): two
    array tasks, then the merge job, give the single run's rows."""
    import os
    import subprocess
    from pathlib import Path

    scripts = Path(__file__).resolve().parents[2] / "scripts" / "slurm"
    suite_file = tiny_suite_file(tmp_path, grid={"mechanisms": ["softmax", "linear"],
                                                 "causal": [False]},
                                 timing={"group_budget_s": 1.0})  # fmt: skip
    out = tmp_path / "out"
    env = dict(os.environ, SLURM_ARRAY_TASK_COUNT="2", PYTHONPATH=os.getcwd())
    bin_dir = Path(sys.executable).parent
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    for task in ("0", "1"):
        done = subprocess.run(
            ["bash", str(scripts / "speed.sbatch"), str(out), "--suite", str(suite_file)],
            env=dict(env, SLURM_ARRAY_TASK_ID=task), capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
    # the first task says how to merge; the last to finish sees every unit there and merges
    assert (out / "results.csv").is_file()
    (out / "results.csv").unlink()
    done = subprocess.run(["bash", str(scripts / "merge.sbatch"), str(out)], env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    merged = pd.read_csv(out / "results.csv")
    units = json.loads((out / "results.json").read_text())["merged"]["units"]
    assert [u["status"] for u in units] == ["ok", "ok"]
    assert set(merged["mechanism"]) == {"softmax", "linear"}
    assert set(merged["status"]) <= {"ok", "unsupported"} and (merged["status"] == "ok").any()
    # a task outside an array is told how to submit
    done = subprocess.run(["bash", str(scripts / "speed.sbatch"), str(out)], env=os.environ,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode != 0 and "sbatch --array" in done.stderr


@pytest.mark.parametrize("command", ["speed", "extrapolate"])
def test_help_names_the_ray_extra_whole(command):
    """Rich markup must not eat the [ray] of the install command the help prints."""
    res = runner.invoke(app, ["run", command, "--help"])
    assert res.exit_code == 0
    words = res.output.replace("│", " ").split()  # the help box wraps lines inside borders
    assert 'pip install "attnbench[ray]"' in " ".join(words)
