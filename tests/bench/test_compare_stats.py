"""``attnbench compare`` with per-round samples: the Mann-Whitney U test, the samples file, the
noise of a comparison, runs not made for comparing, --format json. Synthetic data only."""

from __future__ import annotations

import json
import math
from itertools import combinations

import numpy as np
import pytest
from typer.testing import CliRunner

from attnbench.bench.compare import (
    compare,
    mann_whitney_u,
    noise_of,
    smallest_p,
)
from attnbench.bench.results import (
    KEY,
    SAMPLES_NAME,
    CaseSamples,
    ResultsWriter,
    plain,
    read_results,
    read_samples,
    row_key,
)
from attnbench.cli import app
from tests.helpers.results import grid, sampled_row, write_run

runner = CliRunner()


# --------------------------------------------------------------------------------------------
# The U test
# --------------------------------------------------------------------------------------------


def test_u_of_two_separated_samples_and_its_exact_p():
    # Every current value above every baseline value: U = 3 x 3 = 9, and only 1 of the
    # C(6, 3) = 20 equally likely orderings is that extreme.
    test = mann_whitney_u([4, 5, 6], [1, 2, 3])
    assert test.exact and test.u == 9
    assert test.p_greater == pytest.approx(1 / 20) and test.p_less == 1.0
    assert smallest_p(3, 3) == pytest.approx(0.05)


def test_the_exact_distribution_of_u_for_four_and_four():
    # Counted by hand (orderings of 8 distinct values giving U = 0, 1, ..., 16).
    counts = (1, 1, 2, 3, 5, 5, 7, 7, 8, 7, 7, 5, 5, 3, 2, 1, 1)
    assert sum(counts) == math.comb(8, 4)
    test = mann_whitney_u([1, 3, 5, 7], [2, 4, 6, 8])  # U = 1 + 2 + 3 = 6
    assert test.exact and test.u == 6
    assert test.p_less == pytest.approx(sum(counts[:7]) / 70)  # P(U <= 6) = 24/70
    assert test.p_greater == pytest.approx(sum(counts[6:]) / 70)  # P(U >= 6) = 53/70


def test_ties_use_the_normal_approximation_with_the_tie_correction():
    # N = 10; tie groups 1 x2, 2 x3, 3 x3, 4 x2: sum(t^3 - t) = 6 + 24 + 24 + 6 = 60;
    # var = 25/12 x (11 - 60/90) = 21.53; U = 3; z = (12.5 - 3 - 0.5) / sqrt(21.53) = 1.940.
    test = mann_whitney_u([1, 1, 2, 2, 3], [2, 3, 3, 4, 4])
    assert not test.exact and test.u == 3
    z = (12.5 - 3 - 0.5) / math.sqrt(25 / 12 * (11 - 60 / 90))
    assert test.p_less == pytest.approx(0.5 * math.erfc(z / math.sqrt(2)))
    assert test.p_less == pytest.approx(0.026206, abs=1e-6)
    assert mann_whitney_u([2, 2, 2], [2, 2]).p_greater == 1.0  # nothing to rank


def test_the_test_is_symmetric():
    rng = np.random.default_rng(1)
    for m, n in ((3, 5), (9, 9), (25, 30)):
        x, y = rng.normal(size=m), rng.normal(size=n) + 0.3
        xy, yx = mann_whitney_u(x, y), mann_whitney_u(y, x)
        assert xy.u + yx.u == m * n
        assert xy.p_greater == pytest.approx(yx.p_less)
        assert xy.p_less == pytest.approx(yx.p_greater)


def test_the_exact_p_is_the_share_of_all_splits_at_least_as_extreme():
    """The exact test's definition, enumerated: of the C(m + n, m) ways to deal m + n distinct
    values into the two samples, the share with U >= u (p_greater) and U <= u (p_less)."""
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=5) + 0.8, rng.normal(size=6)
    values = np.concatenate([x, y])
    test = mann_whitney_u(x, y)

    def u_of(first: tuple[int, ...]) -> int:
        rest = [v for i, v in enumerate(values) if i not in first]
        return sum(int(values[i] > v) for i in first for v in rest)

    us = [u_of(first) for first in combinations(range(11), 5)]
    assert test.exact and test.u == u_of(tuple(range(5)))
    assert test.p_greater == pytest.approx(sum(u >= test.u for u in us) / len(us), abs=1e-12)
    assert test.p_less == pytest.approx(sum(u <= test.u for u in us) / len(us), abs=1e-12)


def test_beyond_exact_max_rounds_the_normal_approximation_with_continuity():
    # 21 and 21 distinct values, the current ones all above: U = 441, mean 220.5,
    # var = 21 x 21 x 43 / 12; z = (441 - 220.5 - 0.5) / sd.
    test = mann_whitney_u(list(range(21, 42)), list(range(21)))
    assert not test.exact and test.u == 441
    z = 220 / math.sqrt(21 * 21 * 43 / 12)
    assert test.p_greater == pytest.approx(0.5 * math.erfc(z / math.sqrt(2)), rel=1e-9)
    z_less = -221 / math.sqrt(21 * 21 * 43 / 12)  # (mean - U - 0.5) / sd
    assert test.p_less == pytest.approx(0.5 * math.erfc(z_less / math.sqrt(2)), rel=1e-12)


def test_the_noise_of_a_comparison():
    noise = noise_of([("g", x) for x in [1.1] * 5 + [1.0] * 5 + [0.9] * 5])
    assert noise.common == pytest.approx(1.0) and noise.centre("g") == pytest.approx(1.0)
    assert noise.sigma == pytest.approx(1.4826 * math.log(1.1), rel=0.1)
    assert noise.beyond(2.0, 4) == 1 and noise.beyond(0.5, 4) == -1 and noise.beyond(1.5, 4) == 0
    assert noise_of([("g", 1.3), ("g", 1.2)]).cases == 0  # too few: the floors decide
    # A group whose reference moved moves all its cases: each group is centred on its own.
    moved = noise_of([("a", 1.0 + d) for d in (-0.02, 0, 0.02)] * 2
                     + [("b", 1.5 + d) for d in (-0.03, 0, 0.03)] * 2)  # fmt: skip
    assert moved.centre("b") == pytest.approx(1.5) and moved.sigma < 0.03
    assert moved.beyond(1.5, 4, "b") == 0 and moved.beyond(1.5, 4, "a") == 1


# --------------------------------------------------------------------------------------------
# Synthetic runs with samples
# --------------------------------------------------------------------------------------------


def test_the_samples_file_is_written_and_read_back(tmp_path):
    r, s = sampled_row([0.5, 0.52, 0.49], params="window=64")
    csv_path = write_run(tmp_path / "run", [(r, s)])
    ((key, got),) = read_samples(csv_path).items()
    assert key == row_key(r) and got.time_ms == s.time_ms and got.ref_ratio == s.ref_ratio
    assert got.matmul_ratio == pytest.approx(s.matmul_ratio)  # 6 significant digits kept
    lines = (tmp_path / "run" / SAMPLES_NAME).read_text().splitlines()
    record = json.loads(lines[0])
    assert [record[c] for c in KEY][:3] == ["local", "efficient", "window=64"]
    assert record["ref_ratio"] == [0.5, 0.52, 0.49]
    assert read_samples(write_run(tmp_path / "old", [(r, s)], samples=False)) is None


def test_a_real_run_keeps_its_samples(tmp_path):
    from attnbench.bench.run import run_speed
    from tests.helpers.speed import tiny

    run = run_speed(tiny(mechanisms=("softmax",), lengths=(16,)), tmp_path)
    df = read_results(run.csv)
    kept = read_samples(run.csv)
    assert json.loads(run.sidecar.read_text())["files"]["samples"] == SAMPLES_NAME
    assert len(kept) == len(df)
    for record in df.to_dict("records"):
        samples = kept[row_key({c: plain(record[c]) for c in KEY})]
        assert len(samples.time_ms) == record["samples"] == len(samples.matmul_ratio)
        assert np.median(samples.time_ms) == pytest.approx(record["time_median_ms"], rel=1e-4)
        assert np.median(samples.ref_ratio) == pytest.approx(record["ref_ratio"], rel=1e-4)


def test_half_written_last_lines_are_dropped_with_a_warning(tmp_path):
    cases = [sampled_row([0.5] * 3, seq_len=n) for n in (256, 1024)]
    csv_path = write_run(tmp_path / "run", cases)
    text = csv_path.read_text()
    csv_path.write_text(text[: text.rfind("\n", 0, len(text) - 1) + 40])  # cut mid-row
    samples = tmp_path / "run" / SAMPLES_NAME
    samples.write_text(samples.read_text()[:-30])
    said: list[str] = []
    assert len(read_results(csv_path, said.append)) == 1
    assert len(read_samples(csv_path, said.append)) == 1
    assert len(said) == 2 and all("dropped" in w and "\n" not in w for w in said)
    # A row with a line end but too few fields is not data either.
    csv_path.write_text(text + "local,efficient\n")
    assert len(read_results(csv_path, said.append)) == 2 and "fields" in said[-1]
    # Appending (--resume) cuts the half-written line off first.
    csv_path.write_text(text[:-20])
    ResultsWriter(csv_path, append=True).close()
    assert csv_path.read_text() == text[: text.rfind("\n", 0, len(text) - 1) + 1]


def test_a_a_on_noisy_samples_raises_no_alarm(tmp_path):
    rng = np.random.default_rng(3)
    for trial in range(5):
        a = write_run(tmp_path / f"a{trial}", grid(rng))
        b = write_run(tmp_path / f"b{trial}", grid(rng))
        result = compare(b, a)
        assert result.exit_code == 0, [ln for ln in result.lines if ln.verdict == "worse"]
        assert result.compared == 34 and not result.notes
        assert all(ln.test == "U test 9+9 rounds" for ln in result.lines if ln.test)


def test_a_shifted_distribution_is_flagged(tmp_path):
    rng = np.random.default_rng(4)
    a = write_run(tmp_path / "a", grid(rng))
    b = write_run(tmp_path / "b", grid(rng, shift={"gau": 1.3}))
    result = compare(b, a)
    assert result.exit_code == 1
    worse = {ln.case.split()[0] for ln in result.lines if ln.verdict == "worse"}
    assert worse == {"gau:efficient"}
    (line,) = [ln for ln in result.lines if ln.verdict == "worse"][:1]
    assert line.p_value < 1e-3 and line.test == "U test 9+9 rounds"


def scaled(case: tuple[dict, CaseSamples], factor: float) -> tuple[dict, CaseSamples]:
    """The same case with every per-round ratio ``factor`` times larger."""
    r, s = case
    return sampled_row([x * factor for x in s.ref_ratio], **{c: r[c] for c in KEY})


def test_one_significant_case_within_the_noise_needs_another_case_of_its_path(tmp_path):
    base = grid(np.random.default_rng(5))
    # Between the runs, the other paths' cases move by exp(0.09 q), q = -1, -0.5, 0.5, 1:
    # sigma ~0.1, so x1.3 is beyond 2 sigma (x1.22) but not 4 (x1.49).
    scatter = [math.exp(0.09 * q) for q in (-1, -0.5, 0.5, 1)]
    now = base[:2] + [scaled(c, scatter[i % 4]) for i, c in enumerate(base[2:])]
    now[2:6] = base[2:6]  # local:efficient's four cases do not move...
    now[2] = scaled(base[2], 1.3)  # ...but one, 1.3x in every round
    a = write_run(tmp_path / "a", base)
    b = write_run(tmp_path / "b", now)
    result = compare(b, a)
    assert result.exit_code == 0 and result.count("suspect") == 1
    line = next(ln for ln in result.lines if ln.case.startswith("local") and ln.test)
    assert line.verdict == "suspect" and line.p_value < 1e-3 and line.ratio == pytest.approx(1.3)
    assert "one case of local:efficient alone" in line.note
    # Shown again by a re-run, it is a regression; not shown again, it stays suspect.
    again = compare(b, a, confirm=[b])
    (line,) = [ln for ln in again.lines if ln.verdict == "worse"]
    assert again.exit_code == 1 and "again in the re-run" in line.note
    assert compare(b, a, confirm=[a]).exit_code == 0
    now[3] = scaled(base[3], 1.3)  # a second case of the same path
    result = compare(write_run(tmp_path / "b2", now), a)
    worse = [ln for ln in result.lines if ln.verdict == "worse"]
    assert len(worse) == 2 and all("1 other case of local:efficient" in ln.note for ln in worse)


def test_without_samples_the_threshold_rule_says_so(tmp_path):
    rng = np.random.default_rng(6)
    a = write_run(tmp_path / "a", grid(rng), samples=False)
    b = write_run(tmp_path / "b", grid(rng))
    result = compare(b, a)
    (note,) = result.notes
    assert "no samples file" in note and "threshold rule" in note and str(a) in note
    assert {ln.test for ln in result.lines if ln.test} == {"threshold rule"}


def test_too_few_rounds_for_the_test_are_not_judged_and_say_so(tmp_path):
    """3 rounds a side cannot reach p < 0.001: such time lines are not judged (no band rule
    stands in: it fired on an idle machine's noise), even a 1.6x change, and the note says how
    many rounds would let the test judge them."""
    rng = np.random.default_rng(7)
    a = write_run(tmp_path / "a", grid(rng, rounds=3))
    b = write_run(tmp_path / "b", grid(rng, rounds=3, shift={"gau": 1.6}))
    result = compare(b, a)
    assert result.exit_code == 0 and result.count("worse") == 0
    time_lines = [ln for ln in result.lines if ln.test.endswith("rounds")]
    assert time_lines and all(ln.verdict == "not judged" for ln in time_lines)
    (note,) = [n for n in result.notes if "not judged" in n]
    assert "as few as 3 rounds" in note and "timing.min_rounds=7" in note
    assert "timing.retain_memory=true" in note and "timing.clock=cpu" in note
    assert f"{len(time_lines)} not judged" in result.headline()


def test_enough_rounds_on_one_side_only_is_still_too_few(tmp_path):
    rng = np.random.default_rng(9)
    a = write_run(tmp_path / "a", grid(rng, rounds=12))
    b = write_run(tmp_path / "b", grid(rng, rounds=3, shift={"gau": 1.6}))
    result = compare(b, a)
    gau = [ln for ln in result.lines if ln.case.startswith("gau") and ln.test]
    assert gau and all(ln.verdict == "not judged" for ln in gau), gau
    # 3 against 12 reaches p = 1/455 at best: above 0.001.


def test_runs_not_made_for_comparing_get_one_line_and_wider_thresholds(tmp_path):
    rng = np.random.default_rng(8)
    a = write_run(tmp_path / "a", grid(rng))
    b = write_run(tmp_path / "b", grid(rng, shift={"gau": 1.3}, clock="wall"))
    result = compare(b, a)
    mismatch = [w for w in result.warnings if "not made for comparing" in w]
    assert len(mismatch) == 1 and "\n" not in mismatch[0]
    assert "clock process-cpu in the baseline, wall now" in mismatch[0]
    assert result.limits.tested == pytest.approx(1.2**2)
    assert result.exit_code == 0  # 1.3x is within the wider floor of 1.44x


def test_wildly_different_runs_raise_no_alarm_and_say_why(tmp_path):
    # Two 2-thread wall-clock runs on a busy machine: every case moved by up to 10x.
    rng = np.random.default_rng(9)
    a = write_run(tmp_path / "a", grid(rng, rounds=15))
    cases = grid(rng, rounds=15)
    cases[2:] = [scaled(c, math.exp(rng.normal(0, 1.0))) for c in cases[2:]]
    result = compare(write_run(tmp_path / "b", cases), a)
    assert result.exit_code == 0
    assert any("too widely to show a regression" in n for n in result.notes)


def test_format_json_is_the_whole_comparison_on_stdout(tmp_path):
    rng = np.random.default_rng(10)
    a = write_run(tmp_path / "a", grid(rng))
    b = write_run(tmp_path / "b", grid(rng, shift={"gau": 1.5}))
    done = runner.invoke(app, ["compare", str(b), str(a), "--format", "json"])
    assert done.exit_code == 1, done.output
    data = json.loads(done.stdout)
    assert data["exit_code"] == 1 and data["counts"]["worse"] == 4
    assert data["thresholds"]["p_value"] == 0.001 and data["limits"]["noise"]["cases"] > 8
    worse = [ln for ln in data["lines"] if ln["verdict"] == "worse"]
    assert {ln["impl"] for ln in worse} == {"gau:efficient"} and worse[0]["p_value"] < 1e-3
    assert "worse: gau:efficient" in done.stderr  # messages stay off stdout
    bad = runner.invoke(app, ["compare", str(b), str(a), "--format", "yaml"])
    assert bad.exit_code == 2 and "accepted: table, json" in bad.stderr


def test_a_confirm_file_that_does_not_exist_is_an_error_even_when_nothing_is_worse(tmp_path):
    rng = np.random.default_rng(11)
    a = write_run(tmp_path / "a", grid(rng))
    done = runner.invoke(app, ["compare", str(a), str(a), "--confirm", str(tmp_path / "no.csv")])
    assert done.exit_code == 2
    assert len(done.stderr.strip().splitlines()) == 1 and "no such file" in done.stderr
