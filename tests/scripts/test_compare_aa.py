"""scripts/compare_aa.py: its A/A pairs and injection trials on a tiny grid (one mechanism, one
length: seconds a run), its resuming, and the summary it draws from the records."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from scripts import compare_aa

#: The default suite cut to gqa:efficient (and the reference) at n = 256, forward, bidirectional,
#: with short groups and a small roofline matmul: a run in about 4 s.
TINY_DEFAULT = (
    "--impl gqa:efficient --lengths 256 --direction fwd --no-causal "
    "--set timing.group_budget_s=0.3 --set timing.matmul_size=256"
)
#: The CI grid cut to gqa:efficient (and the reference) at n = 256, forward: two slowed cases.
TINY_CI = "--impl gqa:efficient --lengths 256 --direction fwd"


def read_csv(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        return list(reader.fieldnames or []), list(reader)


@pytest.mark.slow
def test_a_loaded_pair_and_a_tripled_path_on_a_tiny_grid(tmp_path):
    out = tmp_path / "study"
    compare_aa.main(["aa", "--pairs", "1", "--load", "loaded", "--out", str(out),
                     f"--extra={TINY_DEFAULT}"])  # fmt: skip
    pair = out / "aa-loaded" / "pair-01"
    for kept in ("a/results.csv", "a/samples.jsonl", "b/results.json", "b.log", "compare.md"):
        assert (pair / kept).is_file(), kept
    done = (pair / "pair.json").stat().st_mtime_ns
    compare_aa.main(["aa", "--pairs", "1", "--load", "loaded", "--out", str(out),
                     f"--extra={TINY_DEFAULT}"])  # fmt: skip
    assert (pair / "pair.json").stat().st_mtime_ns == done  # resumed: nothing run again

    compare_aa.main(["inject", "--trials", "1", "--factor", "3", "--path", "gqa:efficient",
                     "--out", str(out), f"--extra={TINY_CI}"])  # fmt: skip
    trial = out / "inject" / "gqa-efficient-x3" / "trial-01"
    assert all((trial / run / "results.csv").is_file() for run in compare_aa.GATE_ORDER)
    assert "regression in both pairs" in (trial / "gate.txt").read_text()
    assert str(tmp_path) not in (trial / "compare.md").read_text()  # runs named relatively

    compare_aa.main(["table", "--out", str(out)])
    columns, rows = read_csv(out / "aa.csv")
    assert columns == list(compare_aa.AA_COLUMNS) and len(rows) == 1
    (row,) = rows
    assert row["load"] == "loaded" and row["compared"] == "2"  # gqa and the reference
    assert row["exit_code"] == ("1" if int(row["worse"]) else "0")
    assert row["neighbours"] != "none" and float(row["neighbour_cpu_s"]) > 0
    assert row["extra"] == TINY_DEFAULT

    columns, rows = read_csv(out / "inject.csv")
    assert columns == list(compare_aa.INJECT_COLUMNS) and len(rows) == 1
    (row,) = rows
    assert row["caught"] == "True" and row["gate_exit"] == "1"
    assert row["slowed_cases"] == "2" and row["slowed_worse"] == "2"
    assert row["false_alarms"] == "0"
    assert float(row["slowed_change_min"]) > 2  # x3 of the forward, on the CPU-time clock
    machine = json.loads((out / "machine.json").read_text())
    assert machine["cpu_signature"] in (out / "summary.md").read_text()


def aa_record(**given) -> dict:
    record = dict.fromkeys(compare_aa.AA_COLUMNS, 0)
    record |= {"load": "quiet", "neighbours": "none", "extra": "", "cpu_signature": "cpu x",
               "worse_cases": [], "run_a_wall_s": 80.0, "run_b_wall_s": 90.0}  # fmt: skip
    return record | given


def inject_record(**given) -> dict:
    record = dict.fromkeys(compare_aa.INJECT_COLUMNS, 0)
    record |= {"path": "gqa:efficient", "factor": 1.3, "extra": "", "cpu_signature": "cpu x",
               "false_alarm_cases": [], "slowed_change_min": 1.2,
               "slowed_change_max": 1.4}  # fmt: skip
    return record | given


def write_record(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(record))


def test_table_counts_pairs_and_trials_from_their_records(tmp_path, capsys):
    pairs = [
        aa_record(pair=1, exit_code=0, suspect=1, not_judged=30, compared=300),
        aa_record(pair=2, exit_code=1, worse=2, worse_cases=["x", "y"], compared=310),
        aa_record(load="loaded", pair=1, exit_code=0, neighbours="1 x matmul", compared=305),
    ]
    for r in pairs:
        write_record(tmp_path / f"aa-{r['load']}" / f"pair-{r['pair']:02d}" / "pair.json", r)
    trials = [
        inject_record(trial=1, caught=True),
        inject_record(trial=2, caught=False),
        inject_record(trial=3, caught=True, false_alarms=2, false_alarm_cases=["u", "v"]),
    ]
    for r in trials:
        write_record(tmp_path / "inject" / "gqa-efficient-x1.3" / f"trial-{r['trial']:02d}"
                     / "trial.json", r)  # fmt: skip

    compare_aa.main(["table", "--out", str(tmp_path)])

    _, rows = read_csv(tmp_path / "aa.csv")
    assert [r["worse_cases"] for r in rows] == ["", "", "x; y"]  # loaded first: sorted paths
    summary = (tmp_path / "summary.md").read_text()
    assert summary == capsys.readouterr().out
    quiet = next(ln for ln in summary.splitlines() if ln.startswith("| quiet |"))
    # pairs, exit 0, exit 1, false regressions, suspect, unconfirmed, not judged, compared
    assert quiet.startswith("| quiet | 2 | 1 | 1 | 2 | 1 | 0 | 30 | 300..310 |")
    assert quiet.endswith("| 85.0 | none | only 2 of 10 |")
    path = next(ln for ln in summary.splitlines() if ln.startswith("| gqa:efficient |"))
    # trials, caught, rate, trials with a false alarm, false alarm cases
    assert path.startswith("| gqa:efficient | 1.3 | 3 | 2 | 67% | 1 | 2 | x1.2..1.4 |")
    assert "machine: not recorded" in summary


def test_a_path_must_name_one_registered_path():
    with pytest.raises(SystemExit):
        compare_aa.parser().parse_args(["inject", "--path", "gqa"])
    with pytest.raises(SystemExit):
        compare_aa.parser().parse_args(["inject", "--path", "no-such-mechanism:efficient"])
    args = compare_aa.parser().parse_args(["inject", "--path", "gqa:efficient"])
    assert args.path == ["gqa:efficient"]
