"""The regression gate's thresholds and exit codes (see :mod:`attnbench.bench.compare` for the
rules that use them). Kept apart, with no heavy imports, so that ``attnbench compare --help``
can show the defaults without importing torch or pandas."""

from __future__ import annotations

EXIT_OK, EXIT_REGRESSION, EXIT_USAGE, EXIT_NOTHING = 0, 1, 2, 3

#: One-sided p below which the U test calls the rounds of two runs different (asv: two-sided
#: 0.002). Over ~70 cases and two directions, about one case in seven comparisons would pass it
#: by chance alone if rounds were independent; conditions 2 and 3 stop those.
P_VALUE = 0.001
#: With samples: the ratio of medians a case must move by, besides the U test. A 1.3x slowdown
#: of one path's forward read 1.0-1.55x in the CI grid here (busy-waiting is not exact, and the
#: machine is shared); A/A changes went up to 1.48x (results/compare-aa/README.md), which the
#: noise condition, not this floor, keeps quiet.
MIN_EFFECT = 1.2
#: Without samples (the threshold rule): a time ratio must move by more than this factor and
#: the p20..p80 bands must not overlap. On the shared 2-core machine this was tuned on, ratios
#: to the reference from the CI grid (CPU-time clock) moved by 0.77x..1.30x over 30 A/A
#: comparisons of separate runs, while a 1.5x slowdown of one path read 1.50x..1.71x
#: (results/baselines/README.md). 1.35, with the bands apart, sits between.
TIME_RATIO = 1.35
#: The reference's own time in units of the matmul timed in the same rounds: 0.87x..1.15x over
#: the same 30 A/A comparisons. A different kind of work, hence a little wider than TIME_RATIO.
REF_TIME_RATIO = 1.4
#: A case alone must move away from its group's change by more than NOISE_Z x sigma (and
#: SOLO_EFFECT), sigma the robust spread of the comparison's log changes (see the module
#: docstring): the shifts between runs have heavy tails (up to 10 sigma in one A/A comparison).
NOISE_Z = 6.0
#: A case with another case of the same path (the same mechanism:path, any length, direction or
#: causal flag) beyond the floor and significant must move by more than CORROBORATED_Z x sigma:
#: a slowdown in the code shows in several cases of its path, a fluke of the machine in one.
CORROBORATED_Z = 2.0
#: One case alone (no other case of its path moved so) fails only beyond this factor (and
#: NOISE_Z sigma); below it, it is *suspect*: reported, and a regression only when a re-run
#: (``confirm``) shows it again. A single case can shift that much between two processes of the
#: same code (1.48x here, one case of 28, tight rounds on both sides: memory placement).
SOLO_EFFECT = 2.0
#: When CORROBORATED_Z sigma is beyond this factor, two runs are too noisy to show a
#: regression: what moves is at most suspect (2-thread wall-clock runs on a busy machine).
USELESS_NOISE = 2.0
#: Fewer compared cases than this: no noise estimate, the floors alone.
MIN_CASES_FOR_NOISE = 8
#: A group (cases timed in the same rounds, against the same reference) with at least this many
#: cases is centred on its own median change; smaller ones on the median of all cases.
MIN_GROUP_FOR_CENTRE = 5
#: The U test's exact distribution up to this many rounds a side (and no ties).
EXACT_MAX = 20
#: Deterministic memory counts differ only when allocations change; 2 % and 64 KiB absorb
#: allocator rounding and tiny bookkeeping tensors.
MEM_TOLERANCE = 0.02
MEM_SLACK_BYTES = 64 * 1024
#: Memory from a method that is not deterministic (e.g. the CUDA allocator's peak).
MEM_TOLERANCE_OTHER = 0.10
DETERMINISTIC_MEMORY = ("dispatch-live-bytes",)
#: The ranges ``compare`` accepts (stated in its --help): a factor threshold above 100x, a
#: relative memory tolerance above 10 (1000 %) or a slack above 1 TiB would let any regression
#: through, so a value beyond them is a typo, refused.
MAX_FACTOR = 100.0
MAX_MEM_TOLERANCE = 10.0
MAX_MEM_SLACK = 2**40
#: The metric of the reference's own time (its ratio to itself is 1).
WORK_METRIC = "time x matmul rate"
#: What must agree for two runs to be made for comparing (else: wider thresholds).
SETUP_COLUMNS = ("clock", "threads", "suite")
#: What must agree for two runs to be compared at all (else: skipped, exit 3).
MACHINE_COLUMNS = ("device", "device_name", "torch_version")

VERDICT_ORDER = (
    "worse",
    "unconfirmed",
    "suspect",
    "better",
    "new",
    "missing",
    "not judged",
    "same",
    "not run",
)
