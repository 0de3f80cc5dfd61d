"""Compare a speed run with a baseline, on what stays stable on a noisy, shared machine.

Rows are matched by their key (:data:`attnbench.bench.results.KEY`: mechanism, path, params,
dtype, shape, causal, direction). For each matched pair:

* **time** — not absolute time, which swings 10-20 % between jobs on shared CI and up to 2x, but
  the case's time over the reference mechanism's *in the same interleaved round* (``ref_ratio``;
  for the reference itself: its time over the matmul timed in the same round, i.e. time in units
  of "matmul work"). ``change`` = current median / baseline median. A case is *worse* when:

  1. **it moved beyond its own scatter**: a one-sided **Mann-Whitney U test** (SciPy's) of the
     per-round ratios (current slower), kept in the samples file beside each CSV, gives p <
     ``p_value`` = 0.001 (asv's ``is_different`` asks for a two-sided 0.002, the same thing);
     exact distribution without ties up to :data:`EXACT_MAX` rounds a side, else the normal
     approximation with tie and continuity corrections. The test needs enough rounds to reach
     that p at all (7 and 7, 6 and 9, ...; never 3 and 3): with fewer, the case is *not judged*
     (shown, never failed; a note counts such cases and says how many rounds would do), unless
     a results history judges it (``history``: :mod:`.history_rule`);
  2. ``change`` > ``min_effect`` = 1.2 (the reference's own time ``ref_time_ratio`` = 1.4),
     taken relative to what moved the case's whole group (below);
  3. **it moved beyond the noise of the comparison** (below) by ``CORROBORATED_Z`` = 2 sigma,
     **and** another case of the same path (mechanism:path; any length, direction or causal
     flag) did too — a slowdown in the code shows in several cases of its path, a fluke of the
     machine in one — or, alone, by more than ``SOLO_EFFECT`` = 2x and ``NOISE_Z`` = 6 sigma.
     A case that passes 1, 2 and 2 sigma alone is *suspect*: reported, not failed, and a
     regression when a re-run (``confirm``) shows it again. So is every such case when 2 sigma
     is beyond 2x (``USELESS_NOISE``): such runs cannot show a regression, and a note says so.

  The U test sees the scatter *within* each run; what moves *between* two runs (other
  processes, memory placement) shifts every round of a case together. Over 220 A/A case
  comparisons of the CI grid on this shared 2-core machine, 3 were significant at p < 0.001
  beyond 1.2x, and one case of one run moved 1.48x with tight rounds on both sides, 10 sigma:
  hence condition 3. With it, 10 A/A comparisons gave no alarm and a 1.3x slowdown of one path
  was caught in 9 of 10, both on the machine as it was and with a busy loop on one core
  (results/compare-aa/README.md). Results without a samples file (older results, the
  committed CI baselines) are judged by the **threshold rule** they were tuned with, unchanged
  (bands apart and change > 1.35x), and a note says so. *Better* is the
  mirror image (a better case alone is not reported).
* **the noise of a comparison** — most cases do not change between two runs, so their changes
  measure what moves between runs. Cases timed in the same rounds share a reference, whose own
  drift moves them all: each such group (of at least :data:`MIN_GROUP_FOR_CENTRE` cases) is
  centred on its median change, smaller ones on the median of all cases, and ``sigma`` =
  1.4826 x the median absolute deviation of the log changes around those centres, from at least
  :data:`MIN_CASES_FOR_NOISE` cases (fewer: the floors alone). Two 1-thread CPU-time runs of
  the CI grid give sigma 0.02-0.1 on this machine; two 2-thread wall-clock runs of the default
  suite, with other work running, gave 0.9 (where the old rule saw 30 "regressions"), and a note
  then says that such runs cannot show a regression and how to make comparable ones. The noise
  of the reference's own time comes from every case's ratio to the matmul.
* **FLOPs** — counted, not measured: any difference is a regression (refresh the baseline when a
  count is meant to change).
* **peak memory** — when both rows name a deterministic method (``dispatch-live-bytes``):
  worse when current > baseline x (1 + ``mem_tolerance``) + ``mem_slack_bytes``; other methods
  use ``mem_tolerance_other``.
* **status** — ``ok`` turning into ``oom`` or ``error`` (or ``unsupported``) is a regression; the
  reverse an improvement. ``skipped`` (the sweep's ``max_call_s``, predicted from the same path at
  a smaller n) is *not run*, not a regression: a load burst can trip it, and a real slowdown shows
  in that smaller case, which is compared.

**Runs not made for comparing** — another clock, thread count or suite: said in one line, and
compared with every time floor squared (1.2 -> 1.44, 1.35 -> 1.82, 1.4 -> 1.96) besides the
noise condition (which widens by itself for such pairs). Another device, CPU or torch version is
skipped with a warning (exit 3).

**Confirmation** (``confirm``: results of the same grid run again): a quantity counts as *worse*
only when it is worse in this run and shown again (worse or suspect) in every re-run; one that
is worse in this run alone is *unconfirmed*, reported and not failed; a suspect one shown again
by every re-run is worse. A slowdown that the code causes repeats; a neighbour's
burst of load on a shared machine rarely hits the same case twice. ``.ci/run`` re-runs the grid
only when the first comparison finds something worse or suspect.

Rows only in the current run are *new* (mechanisms added since the baseline) and rows only in
the baseline are *missing*; both are reported and neither fails.

Exit codes: 0 nothing worse, 1 at least one regression, 2 usage error (a file that is not a
results CSV, one with nothing measured, a re-run that cannot be compared), 3 nothing comparable.

The parts: :mod:`.records` (thresholds, noise, lines, the comparison), :mod:`.statistics` (the
U test, the noise), :mod:`.decision` (conditions 1-3 on one time quantity), :mod:`.cases` (one
matched case), :mod:`.files` (two results files, re-runs), :mod:`.render` (markdown, JSON).
"""

from attnbench.bench.compare.cases import (
    compare_rows,
    group_of,
    is_reference,
    machine_of,
    time_change,
    uses_ref_ratio,
)
from attnbench.bench.compare.decision import RULE, Timing, judge, weigh_noise
from attnbench.bench.compare.files import (
    REPEATED,
    compare,
    noise_notes,
    read_measured,
    setup_mismatch,
)
from attnbench.bench.compare.records import Comparison, Limits, Line, Noise, Thresholds
from attnbench.bench.compare.render import as_json, markdown
from attnbench.bench.compare.statistics import (
    UTest,
    limits_for,
    mann_whitney_u,
    noise_of,
    smallest_p,
    too_noisy,
)

__all__ = [
    "REPEATED",
    "RULE",
    "Comparison",
    "Limits",
    "Line",
    "Noise",
    "Thresholds",
    "Timing",
    "UTest",
    "as_json",
    "compare",
    "compare_rows",
    "group_of",
    "is_reference",
    "judge",
    "limits_for",
    "machine_of",
    "mann_whitney_u",
    "markdown",
    "noise_notes",
    "noise_of",
    "read_measured",
    "setup_mismatch",
    "smallest_p",
    "time_change",
    "too_noisy",
    "uses_ref_ratio",
    "weigh_noise",
]
