"""The keys of a speed suite file (TOML; documented in docs/speed.md, section "Speed suite
files"): one frozen dataclass per table (:mod:`attnbench.runtime.schema`), the single list of
accepted keys, their types, defaults, meaning and what each accepts. Read by
:func:`attnbench.bench.config.parse_suite`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, get_args

import torch

from attnbench.core.spec import PATH_KINDS, PathKind
from attnbench.core.varlen import valid_varlen
from attnbench.measure.gpu_timing import L2_MODES
from attnbench.measure.timing import CLOCKS, ORDERS
from attnbench.runtime.schema import Checked, Invalid, Rule, at_least, setting, within

Device = Literal["auto", "cpu", "cuda"]
Direction = Literal["fwd", "fwdbwd"]
DtypeName = Literal["float32", "fp32", "float64", "fp64", "bfloat16", "bf16", "float16", "fp16"]
Order = Literal[ORDERS]  # measure.timing's orders
ClockKind = Literal[CLOCKS]
L2Mode = Literal[L2_MODES]  # measure.gpu_timing's modes

DIRECTIONS: tuple[str, ...] = get_args(Direction)
DEVICES: tuple[str, ...] = get_args(Device)
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float64": torch.float64,
    "fp64": torch.float64,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}

#: The longest sequence a sweep accepts: 2^31 - 1, the int32 index range of the kernels (and far
#: beyond any machine's memory at any head dim); a longer one overflows tensor creation.
MAX_LENGTH = 2**31 - 1
#: Timed rounds at most; and the longest a duration setting may be (seconds): a day for a
#: group's or a call's time budget, a minute for a warm-up, a sample or the matmul's call.
MAX_ROUNDS = 10_000
DAY_S, MINUTE_S = 86_400, 60


@dataclass(frozen=True)
class Grid(Checked):
    """``[grid]``: what is measured."""

    mechanisms: tuple[str, ...] = setting(
        ("*",),
        'mechanism names, `NAME:PATH` for one path, or `"*"` for every registered mechanism',
        accepted='a non-empty list of names, NAME:PATH, or "*"',
        non_empty=True,
    )
    exclude: tuple[str, ...] = setting((), "names or `NAME:PATH` to leave out")
    path_kinds: tuple[PathKind, ...] = setting(
        PATH_KINDS,
        "which kinds of path to run for a mechanism named without a path",
        non_empty=True,
    )
    device: Device = setting("auto", "`auto` (CUDA when visible, else CPU), `cpu` or `cuda`")
    dtypes: tuple[DtypeName, ...] = setting(
        ("float32",),
        "float32, float64, bfloat16, float16",
        accepted="a non-empty list from float32, float64, bfloat16, float16",
        non_empty=True,
    )
    directions: tuple[Direction, ...] = setting(
        DIRECTIONS, "`fwd` (forward, no grad) and/or `fwdbwd` (forward + backward)", non_empty=True
    )
    causal: tuple[bool, ...] = setting(
        (False, True), "`false` (bidirectional) and/or `true` (causal)", non_empty=True
    )
    lengths: tuple[int, ...] = setting(
        (256, 1024),
        "sequence lengths n, measured in increasing order",
        valid=within(1, MAX_LENGTH),
        non_empty=True,
    )
    reference: str = setting(
        "softmax:efficient",
        'the `NAME:PATH` every time is divided by, measured in the same rounds; `""` for none',
    )


@dataclass(frozen=True)
class Shape(Checked):
    """``[shape]``: the tensor shape of each case."""

    batch: int = setting(1, "batch size B", valid=at_least(1))
    tokens: int = setting(
        0,
        "if > 0: B = max(1, tokens // n) instead of `batch` (flash-attention's 16k-token sweep)",
        valid=at_least(0),
    )
    heads: int = setting(4, "query heads H", valid=at_least(1))
    hidden: int = setting(
        0, "if > 0: H = hidden // head_dim instead of `heads` (must divide)", valid=at_least(0)
    )
    head_dims: tuple[int, ...] = setting(
        (64,), "head dimensions D (= Dv)", valid=at_least(1), non_empty=True
    )
    query_lengths: tuple[int, ...] = setting(
        (),
        "decoding: new queries per call against a K/V cache or state of each length n "
        "(`lengths`), each mechanism's decode forms; empty: every query (self-attention)",
        valid=within(1, MAX_LENGTH),
    )
    kv_heads: tuple[int, ...] = setting(
        (),
        "K/V heads for the mechanisms that share K/V across query heads and take a `kv_heads` "
        "parameter (GQA), one case each; empty: the parameter's value",
        valid=at_least(1),
    )
    varlen: Any = setting(
        "",
        "a packed batch of sequences of different lengths instead of `lengths`: the lengths "
        '(`[700, 300, 24]` or `"700,300,24"`), or `"tokens=T,count=N,seed=S"`: N lengths drawn '
        "with seed S that add up to exactly T; each path runs it packed and padded",
        accepted='a list of lengths >= 1, "L1,L2,...", or "tokens=T,count=N,seed=S"',
        valid=valid_varlen,
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.varlen not in ("", None, ()) and self.query_lengths:
            raise Invalid(
                "varlen",
                "varlen and query_lengths cannot be combined (a packed batch is the prefill "
                "shape); accepted: one of them",
            )
        for head_dim in self.head_dims:
            if self.hidden and self.hidden % head_dim:
                raise Invalid(
                    "hidden",
                    f"hidden = {self.hidden} is not divisible by head_dim {head_dim}; "
                    "accepted: a multiple of every head_dim",
                )


@dataclass(frozen=True)
class Limits(Checked):
    """``[limits]``: lengths not to attempt."""

    max_len: dict[PathKind, int] = setting(
        {},
        "longest n per path kind, e.g. `{ reference = 1024 }` (dense n x n oracles); "
        "an explicit `--lengths` lifts these",
        accepted="a table from path kinds (reference, efficient, fused) to integers >= 1",
        valid=within(1, MAX_LENGTH),
    )
    max_call_s: float = setting(
        0.0,
        "when one call of a case takes longer than this (seconds), or the next length's call "
        "is predicted to (time x (n'/n)^2), its longer lengths are skipped with a row saying "
        "so; 0: no limit",
        valid=within(0, DAY_S),
    )


@dataclass(frozen=True)
class Timing(Checked):
    """``[timing]``: warm-up, rounds, threads, calibration."""

    threads: int = setting(
        0, "torch CPU threads, fixed for the run and recorded; 0: one per logical core",
        valid=at_least(0),
    )  # fmt: skip
    max_threads: int = setting(
        0,
        "with `threads = 0`: at most this many (0: no cap), for a grid of calls too small for "
        "more threads to pay",
        valid=at_least(0),
    )
    warmup_calls: int = setting(
        2, "untimed calls at least (the first compiles/autotunes)", valid=within(1, MAX_ROUNDS)
    )
    warmup_s: float = setting(0.05, "and untimed seconds at least", valid=within(0, MINUTE_S))
    rounds: int = setting(
        5, "timed rounds at most (one sample per case a round)", valid=within(1, MAX_ROUNDS)
    )
    min_rounds: int = setting(3, "timed rounds at least", valid=within(1, MAX_ROUNDS))
    block_s: float = setting(
        0.005, "a sample averages enough calls to last this long", valid=within(0, MINUTE_S)
    )
    group_budget_s: float = setting(
        4.0,
        "timed rounds stop once one length's group has taken this long (seconds; after "
        "min_rounds, before rounds)",
        valid=Rule(lambda x: 0 < x <= DAY_S, f"> 0 and at most {DAY_S}"),
    )
    matmul_size: int = setting(
        2048,
        "size of the square matmul timed for the roofline (at most: see matmul_max_s)",
        valid=within(1, 65_536),
    )
    matmul_max_s: float = setting(
        1.0,
        "the roofline's matmul is the largest power-of-two size up to matmul_size whose call "
        "takes at most this long here (seconds; 0: always matmul_size)",
        valid=within(0, MINUTE_S),
    )
    copy_mib: int = setting(
        256,
        "decoding's memory roofline: a copy of this many MiB (read and written) timed in the "
        "same rounds as the decode cases; larger than the caches, so it measures memory",
        valid=at_least(1),
    )
    retain_memory: bool = setting(
        False,
        "keep freed memory in the process (glibc), so no call pays the kernel for fresh pages: "
        "steadier CPU times for paths that allocate big temporaries (the CI grid uses it)",
    )
    order: Order = setting(
        "rotate",
        "the order of each timed round: `rotate` (the matmul and the cases, one place further "
        "on each round, so none keeps a position), `fixed`, `reversed` or `shuffle` (seeded); "
        "for checking that a ratio does not depend on the order",
    )
    clock: ClockKind = setting(
        "wall",
        "`wall` (elapsed time; CUDA events on a GPU) or `cpu` (CPU time of the process: immune "
        "to being descheduled on a busy machine; CPU device only)",
    )
    l2: L2Mode | None = setting(
        None,
        "`cold` (a buffer of at least twice the L2 written before every timed call, outside the "
        "timed region) or `warm` (no flush: what a loop of calls sees; the GPU default); "
        "CUDA only, recorded in every row",
    )
    graph: bool = setting(
        False,
        "time replays of a CUDA graph of each case's call, where the path can be captured (a row "
        "that could not be says why in `graph_reason`); CUDA only, recorded in every row",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.min_rounds > self.rounds:
            raise Invalid(
                "min_rounds",
                f"min_rounds = {self.min_rounds} exceeds rounds = {self.rounds}; "
                "accepted: min_rounds <= rounds",
            )


@dataclass(frozen=True)
class Profile(Checked):
    """``[profile]``: where each case's time goes, from torch.profiler (untimed calls)."""

    calls: int = setting(
        0,
        "once every case is timed, set each ok case up again and run it this many times under "
        "torch.profiler, and write what ran (CUDA: every kernel, copy and memset; CPU: "
        "operators by self time) to `kernels.csv`; 0: no profile",
        valid=within(0, 1000),
    )
    trace: bool = setting(
        False,
        "also write each profiled case as a Chrome trace, `traces/<case>.json` (Perfetto, "
        "chrome://tracing); with `calls` > 0",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.trace and not self.calls:
            raise Invalid(
                "trace",
                "trace = true with calls = 0 profiles nothing; accepted: trace = true with "
                "calls >= 1 (e.g. --set profile.calls=3)",
            )


@dataclass(frozen=True)
class SuiteFile(Checked):
    """A speed suite file: two keys at the top, then its tables."""

    name: str = setting("", "name written in every row's `suite` column (default: the file name)")
    description: str = setting("", "one line saying what the suite is for")
    grid: Grid = setting(Grid, "what is measured")
    shape: Shape = setting(Shape, "the tensor shape of each case")
    limits: Limits = setting(Limits, "lengths not to attempt")
    timing: Timing = setting(Timing, "warm-up, rounds, threads, calibration")
    profile: Profile = setting(Profile, "kernel profiles of the cases (none by default)")
    params: dict[str, dict[str, Any]] = setting(
        {},
        "parameter overrides: `[params.NAME]` then `key = value`",
        accepted="tables of parameters, e.g. [params.NAME]",
    )


#: The tables of a suite file, for ``--set SECTION.FIELD=VALUE`` (``params.NAME.KEY`` too).
SECTIONS = ("grid", "shape", "limits", "timing", "profile", "params")
