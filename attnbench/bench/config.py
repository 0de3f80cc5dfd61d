"""The speed suite's file format and its resolved form, :class:`SpeedSuite`.

A suite file is TOML (documented in the README, section "Speed suite files"); the schemas below
are the single list of accepted keys, their defaults and their meaning. Command-line options
override the file through :func:`override`. Mechanisms are consumed through the registry only:
a suite names mechanisms (or ``"*"``, all of them) and path kinds, never special cases.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from attnbench import registry
from attnbench.core.errors import AttnbenchError, unknown
from attnbench.core.spec import PATH_KINDS, Mechanism, PathSpec
from attnbench.measure import machine
from attnbench.measure.timing import ORDERS, TimingPolicy
from attnbench.runtime.tomlconfig import Key, SuiteText, find_suite, load, read_table

DIRECTIONS = ("fwd", "fwdbwd")
DEVICES = ("auto", "cpu", "cuda")
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


def _positive(x: Any) -> bool:
    return x >= 1


#: The longest sequence a sweep accepts: 2^31 - 1, the int32 index range of the kernels (and far
#: beyond any machine's memory at any head dim); a longer one overflows tensor creation.
MAX_LENGTH = 2**31 - 1


def _positive_list(xs: Sequence[int]) -> bool:
    return len(xs) > 0 and all(x >= 1 for x in xs)


def _lengths_ok(xs: Sequence[int]) -> bool:
    return _positive_list(xs) and all(x <= MAX_LENGTH for x in xs)


TOP = {
    "name": Key("str", "", "name written in every row's `suite` column (default: the file name)"),
    "description": Key("str", "", "one line saying what the suite is for"),
    "grid": Key("table", {}, "what is measured"),
    "shape": Key("table", {}, "the tensor shape of each case"),
    "limits": Key("table", {}, "lengths not to attempt"),
    "timing": Key("table", {}, "warm-up, rounds, threads, calibration"),
    "params": Key("table", {}, "parameter overrides: `[params.NAME]` then `key = value`"),
}

GRID = {
    "mechanisms": Key(
        "list[str]",
        ["*"],
        'mechanism names, `NAME:PATH` for one path, or `"*"` for every registered mechanism',
        accepted='a non-empty list of names, NAME:PATH, or "*"',
        valid=lambda xs: len(xs) > 0,
    ),
    "exclude": Key("list[str]", [], "names or `NAME:PATH` to leave out"),
    "path_kinds": Key(
        "list[str]",
        list(PATH_KINDS),
        "which kinds of path to run for a mechanism named without a path",
        accepted=f"a non-empty list from {', '.join(PATH_KINDS)}",
        valid=lambda xs: len(xs) > 0 and set(xs) <= set(PATH_KINDS),
    ),
    "device": Key(
        "str",
        "auto",
        "`auto` (CUDA when visible, else CPU), `cpu` or `cuda`",
        accepted=", ".join(DEVICES),
        valid=lambda x: x in DEVICES,
    ),
    "dtypes": Key(
        "list[str]",
        ["float32"],
        "float32, float64, bfloat16, float16",
        accepted="a non-empty list from float32, float64, bfloat16, float16",
        valid=lambda xs: len(xs) > 0 and all(x in DTYPES for x in xs),
    ),
    "directions": Key(
        "list[str]",
        list(DIRECTIONS),
        "`fwd` (forward, no grad) and/or `fwdbwd` (forward + backward)",
        accepted="a non-empty list from fwd, fwdbwd",
        valid=lambda xs: len(xs) > 0 and set(xs) <= set(DIRECTIONS),
    ),
    "causal": Key(
        "list[bool]",
        [False, True],
        "`false` (bidirectional) and/or `true` (causal)",
        accepted="a non-empty list of true/false",
        valid=lambda xs: len(xs) > 0,
    ),
    "lengths": Key(
        "list[int]",
        [256, 1024],
        "sequence lengths n, measured in increasing order",
        accepted=f"a non-empty list of integers from 1 to {MAX_LENGTH}",
        valid=_lengths_ok,
    ),
    "reference": Key(
        "str",
        "softmax:efficient",
        'the `NAME:PATH` every time is divided by, measured in the same rounds; `""` for none',
    ),
}

SHAPE = {
    "batch": Key("int", 1, "batch size B", accepted="an integer >= 1", valid=_positive),
    "tokens": Key(
        "int",
        0,
        "if > 0: B = max(1, tokens // n) instead of `batch` (flash-attention's 16k-token sweep)",
        accepted="an integer >= 0",
        valid=lambda x: x >= 0,
    ),
    "heads": Key("int", 4, "query heads H", accepted="an integer >= 1", valid=_positive),
    "hidden": Key(
        "int",
        0,
        "if > 0: H = hidden // head_dim instead of `heads` (must divide)",
        accepted="an integer >= 0",
        valid=lambda x: x >= 0,
    ),
    "head_dims": Key(
        "list[int]",
        [64],
        "head dimensions D (= Dv)",
        accepted="a non-empty list of integers >= 1",
        valid=_positive_list,
    ),
}

LIMITS = {
    "max_len": Key(
        "table[int]",
        {},
        "longest n per path kind, e.g. `{ reference = 1024 }` (dense n x n oracles); "
        "an explicit `--lengths` lifts these",
        accepted="a table from path kinds (reference, efficient, fused) to integers >= 1",
        valid=lambda t: set(t) <= set(PATH_KINDS) and all(v >= 1 for v in t.values()),
    ),
    "max_call_s": Key(
        "float",
        0.0,
        "when one call of a case takes longer than this (seconds), or the next length's call "
        "is predicted to (time x (n'/n)^2), its longer lengths are skipped with a row saying "
        "so; 0: no limit",
        accepted="a number >= 0",
        valid=lambda x: x >= 0,
    ),
}

TIMING = {
    "threads": Key(
        "int",
        0,
        "torch CPU threads, fixed for the run and recorded; 0: one per logical core",
        accepted="an integer >= 0",
        valid=lambda x: x >= 0,
    ),
    "warmup_calls": Key(
        "int", 2, "untimed calls at least (the first compiles/autotunes)", valid=_positive
    ),
    "warmup_s": Key(
        "float", 0.05, "and untimed seconds at least", valid=lambda x: x >= 0, accepted=">= 0"
    ),
    "rounds": Key("int", 5, "timed rounds at most (one sample per case a round)", valid=_positive),
    "min_rounds": Key("int", 3, "timed rounds at least", valid=_positive),
    "block_s": Key(
        "float",
        0.005,
        "a sample averages enough calls to last this long",
        valid=lambda x: x >= 0,
        accepted=">= 0",
    ),
    "group_budget_s": Key(
        "float",
        4.0,
        "timed rounds stop once one length's group has taken this long (seconds; after "
        "min_rounds, before rounds)",
        valid=lambda x: x > 0,
        accepted="> 0",
    ),
    "matmul_size": Key(
        "int", 2048, "size of the square matmul timed for the roofline", valid=_positive
    ),
    "retain_memory": Key(
        "bool",
        False,
        "keep freed memory in the process (glibc), so no call pays the kernel for fresh pages: "
        "steadier CPU times for paths that allocate big temporaries (the CI grid uses it)",
    ),
    "order": Key(
        "str",
        "rotate",
        "the order of each timed round: `rotate` (the matmul and the cases, one place further "
        "on each round, so none keeps a position), `fixed`, `reversed` or `shuffle` (seeded); "
        "for checking that a ratio does not depend on the order",
        accepted=", ".join(ORDERS),
        valid=lambda x: x in ORDERS,
    ),
    "clock": Key(
        "str",
        "wall",
        "`wall` (elapsed time; CUDA events on a GPU) or `cpu` (CPU time of the process: immune "
        "to being descheduled on a busy machine; CPU device only)",
        accepted="wall, cpu",
        valid=lambda x: x in ("wall", "cpu"),
    ),
}


@dataclass(frozen=True)
class SpeedSuite:
    """A speed suite, resolved: what to run, on what shapes, and how to time it."""

    name: str
    description: str = ""
    file: str | None = None
    sha256: str | None = None
    mechanisms: tuple[str, ...] = ("*",)
    exclude: tuple[str, ...] = ()
    path_kinds: tuple[str, ...] = PATH_KINDS
    device: str = "auto"
    dtypes: tuple[str, ...] = ("float32",)
    directions: tuple[str, ...] = DIRECTIONS
    causal: tuple[bool, ...] = (False, True)
    lengths: tuple[int, ...] = (256, 1024)
    reference: str = "softmax:efficient"
    batch: int = 1
    tokens: int = 0
    heads: int = 4
    hidden: int = 0
    head_dims: tuple[int, ...] = (64,)
    max_len: Mapping[str, int] = field(default_factory=dict)
    max_call_s: float = 0.0
    threads: int = 0
    timing: TimingPolicy = TimingPolicy()
    matmul_size: int = 2048
    #: Parameter overrides per mechanism name, as given (values or text; resolved per mechanism).
    params: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    #: Overrides from --param NAME=VALUE, applied to every selected mechanism that has NAME.
    common_params: Mapping[str, Any] = field(default_factory=dict)

    # -- derived ---------------------------------------------------------------------------
    def torch_device(self) -> torch.device:
        return resolve_device(self.device)

    def torch_dtypes(self) -> list[torch.dtype]:
        return [DTYPES[d] for d in self.dtypes]

    def thread_count(self) -> int:
        return self.threads or os.cpu_count() or 1

    def batch_for(self, n: int) -> int:
        return max(1, self.tokens // n) if self.tokens else self.batch

    def heads_for(self, head_dim: int) -> int:
        return self.hidden // head_dim if self.hidden else self.heads

    def settings(self) -> dict[str, Any]:
        """Everything that decides the measurements, for the sidecar."""
        return {
            "name": self.name,
            "description": self.description,
            "file": portable_path(self.file),
            "sha256": self.sha256,
            "mechanisms": list(self.mechanisms),
            "exclude": list(self.exclude),
            "path_kinds": list(self.path_kinds),
            "device": self.device,
            "dtypes": list(self.dtypes),
            "directions": list(self.directions),
            "causal": list(self.causal),
            "lengths": list(self.lengths),
            "reference": self.reference,
            "shape": {
                "batch": self.batch,
                "tokens": self.tokens,
                "heads": self.heads,
                "hidden": self.hidden,
                "head_dims": list(self.head_dims),
            },
            "limits": {"max_len": dict(self.max_len), "max_call_s": self.max_call_s},
            "timing": {**vars(self.timing), "threads": self.threads},
            "matmul_size": self.matmul_size,
            "params": {k: dict(v) for k, v in self.params.items()},
            "common_params": dict(self.common_params),
        }


# --------------------------------------------------------------------------------------------
# Reading a file
# --------------------------------------------------------------------------------------------


def portable_path(file: str) -> str:
    """A suite file as a sidecar records it: relative to the attnbench checkout or package it
    ships in (``suites/ci.toml``), else its name alone: never a machine's absolute path (the
    sha256 beside it identifies the content)."""
    from pathlib import Path

    if not file:
        return file
    path = Path(file).resolve()
    package = Path(__file__).resolve().parent.parent  # attnbench/
    for root in (package.parent, package):
        if path.is_relative_to(root):
            return path.relative_to(root).as_posix()
    return path.name


def load_suite(name: str, mechanisms: Sequence[Mechanism] | None = None) -> SpeedSuite:
    """Find, parse and validate a speed suite file (``speed``, ``ci``, or a path)."""
    text = load(find_suite(name))
    return parse_suite(text, mechanisms)


def parse_suite(text: SuiteText, mechanisms: Sequence[Mechanism] | None = None) -> SpeedSuite:
    top = read_table(text, text.data, TOP, ())
    grid = read_table(text, top["grid"], GRID, ("grid",))
    shape = read_table(text, top["shape"], SHAPE, ("shape",))
    limits = read_table(text, top["limits"], LIMITS, ("limits",))
    timing = read_table(text, top["timing"], TIMING, ("timing",))
    params = top["params"]
    mechs = list(mechanisms if mechanisms is not None else registry.MECHANISMS)
    for name, table in params.items():
        if not isinstance(table, dict):
            raise text.error(
                ("params", name),
                f"[params] {name} must be a table of parameters, e.g. [params.{name}]",
            )
        try:
            _lookup(name, mechs).resolve(table)
        except AttnbenchError as e:
            raise text.error(("params", name), f"[params.{name}] {e}") from None
    if timing["min_rounds"] > timing["rounds"]:
        raise text.error(
            ("timing", "min_rounds"),
            f"[timing] min_rounds = {timing['min_rounds']} exceeds rounds = {timing['rounds']}; "
            "accepted: min_rounds <= rounds",
        )
    for head_dim in shape["head_dims"]:
        if shape["hidden"] and shape["hidden"] % head_dim:
            raise text.error(
                ("shape", "hidden"),
                f"[shape] hidden = {shape['hidden']} is not divisible by head_dim {head_dim}; "
                "accepted: a multiple of every head_dim",
            )
    suite = SpeedSuite(
        name=top["name"] or text.path.stem,
        description=top["description"],
        file=str(text.path),
        sha256=text.sha256,
        mechanisms=tuple(grid["mechanisms"]),
        exclude=tuple(grid["exclude"]),
        path_kinds=tuple(grid["path_kinds"]),
        device=grid["device"],
        dtypes=tuple(grid["dtypes"]),
        directions=tuple(dict.fromkeys(grid["directions"])),
        causal=tuple(dict.fromkeys(grid["causal"])),
        lengths=tuple(sorted(set(grid["lengths"]))),
        reference=grid["reference"],
        batch=shape["batch"],
        tokens=shape["tokens"],
        heads=shape["heads"],
        hidden=shape["hidden"],
        head_dims=tuple(shape["head_dims"]),
        max_len=dict(limits["max_len"]),
        max_call_s=limits["max_call_s"],
        threads=timing["threads"],
        timing=TimingPolicy(
            warmup_calls=timing["warmup_calls"],
            warmup_s=timing["warmup_s"],
            rounds=timing["rounds"],
            min_rounds=timing["min_rounds"],
            block_s=timing["block_s"],
            group_budget_s=timing["group_budget_s"],
            clock=timing["clock"],
            retain_memory=timing["retain_memory"],
            order=timing["order"],
        ),
        matmul_size=timing["matmul_size"],
        params={k: dict(v) for k, v in params.items()},
    )
    for key, items in (("mechanisms", suite.mechanisms), ("exclude", suite.exclude)):
        for item in items:
            if item == "*":
                continue
            try:
                _parse_item(item, mechs)
            except AttnbenchError as e:
                raise text.error(("grid", key), f"[grid] {key}: {e}") from None
    if suite.reference:
        try:
            _parse_item(suite.reference, mechs)
        except AttnbenchError as e:
            raise text.error(("grid", "reference"), f"[grid] reference: {e}") from None
    return suite


# --------------------------------------------------------------------------------------------
# Command-line overrides
# --------------------------------------------------------------------------------------------


def parse_lengths(text: str) -> tuple[int, ...]:
    """``"256,1024"`` -> (256, 1024); anything else is an error naming the bad item."""
    items = [t.strip() for t in text.split(",")]
    out = []
    for item in items:
        try:
            value = int(item)
        except ValueError:
            value = 0
        if not 1 <= value <= MAX_LENGTH or str(value) != item.lstrip("+"):
            raise AttnbenchError(
                f"--lengths: {item!r} is not an integer from 1 to {MAX_LENGTH}; "
                "accepted: comma-separated integers, e.g. 256,1024,4096"
            )
        out.append(value)
    return tuple(sorted(set(out)))


def override(
    suite: SpeedSuite,
    *,
    impls: Sequence[str] = (),
    lengths: str | None = None,
    device: str | None = None,
    dtype: str | None = None,
    direction: str | None = None,
    causal: bool | None = None,
    threads: int | None = None,
    rounds: int | None = None,
    reference: str | None = None,
    params: Mapping[str, str] | None = None,
    mechanisms: Sequence[Mechanism] | None = None,
) -> SpeedSuite:
    """The suite with command-line options applied, each validated with a one-line error."""
    mechs = list(mechanisms if mechanisms is not None else registry.MECHANISMS)
    changes: dict[str, Any] = {}
    if impls:
        for item in impls:
            _parse_item(item, mechs)
        changes["mechanisms"] = tuple(dict.fromkeys(impls))
        changes["exclude"] = ()
    if lengths is not None:
        changes["lengths"] = parse_lengths(lengths)
        changes["max_len"] = {}  # explicit lengths are run as asked
    if device is not None:
        if device not in DEVICES:
            raise AttnbenchError(f"--device {device!r}: accepted: {', '.join(DEVICES)}")
        changes["device"] = device
    if dtype is not None:
        if dtype not in DTYPES:
            raise AttnbenchError(f"--dtype {dtype!r}: accepted: {', '.join(DTYPES)}")
        changes["dtypes"] = (dtype,)
    if direction is not None:
        choices = {"fwd": ("fwd",), "fwdbwd": ("fwdbwd",), "both": DIRECTIONS}
        if direction not in choices:
            raise AttnbenchError(f"--direction {direction!r}: accepted: fwd, fwdbwd, both")
        changes["directions"] = choices[direction]
    if causal is not None:
        changes["causal"] = (causal,)
    if threads is not None:
        if threads < 0:
            raise AttnbenchError(f"--threads {threads}: accepted: an integer >= 0 (0: all cores)")
        changes["threads"] = threads
    if rounds is not None:
        if rounds < 1:
            raise AttnbenchError(f"--rounds {rounds}: accepted: an integer >= 1")
        changes["timing"] = replace(
            suite.timing, rounds=rounds, min_rounds=min(rounds, suite.timing.min_rounds)
        )
    if reference is not None:
        ref = "" if reference.lower() == "none" else reference
        if ref:
            _parse_item(ref, mechs)
        changes["reference"] = ref
    if params:
        changes["common_params"] = dict(params)
    out = replace(suite, **changes)
    if resolve_device(out.device).type == "cuda" and out.timing.clock == "cpu":
        raise AttnbenchError(
            "[timing] clock = 'cpu' measures CPU time, which means nothing for CUDA work; "
            "accepted with a GPU: clock = 'wall'"
        )
    selected = select(out, mechs)
    for key in out.common_params:
        if not any(key in m.param_names for m, _ in selected):
            raise AttnbenchError(
                f"--param {key}: no selected mechanism has a parameter {key!r}; "
                "see `attnbench list` for each mechanism's parameters"
            )
    return out


def resolve_device(name: str) -> torch.device:
    if name not in DEVICES:
        raise AttnbenchError(f"device {name!r}: accepted: {', '.join(DEVICES)}")
    return machine.resolve_device(name, "--device (or the suite's [grid] device)")


# --------------------------------------------------------------------------------------------
# What to run
# --------------------------------------------------------------------------------------------


def _lookup(name: str, mechs: Sequence[Mechanism]) -> Mechanism:
    for m in mechs:
        if name == m.name or name in m.aliases:
            return m
    raise unknown("mechanism", name, [m.name for m in mechs])


def _parse_item(item: str, mechs: Sequence[Mechanism]) -> tuple[Mechanism, PathSpec | None]:
    """``NAME`` or ``NAME:PATH`` -> (mechanism, path or None), validated against ``mechs``."""
    name, _, path = item.partition(":")
    mech = _lookup(name.strip(), mechs)
    return mech, (mech.path(path.strip()) if path.strip() else None)


def select(
    suite: SpeedSuite, mechanisms: Sequence[Mechanism] | None = None
) -> list[tuple[Mechanism, PathSpec]]:
    """The (mechanism, path) pairs a suite runs, in order, the reference included."""
    mechs = list(mechanisms if mechanisms is not None else registry.MECHANISMS)
    chosen: dict[tuple[str, str], tuple[Mechanism, PathSpec]] = {}

    def add(mech: Mechanism, path: PathSpec | None) -> None:
        kinds = suite.path_kinds
        paths = [path] if path is not None else [p for p in mech.paths if p.kind in kinds]
        for p in paths:
            chosen.setdefault((mech.name, p.name), (mech, p))

    for item in suite.mechanisms:
        if item == "*":
            for mech in mechs:
                add(mech, None)
        else:
            add(*_parse_item(item, mechs))
    for item in suite.exclude:
        mech, path = _parse_item(item, mechs)
        for key in [k for k in chosen if k[0] == mech.name and (path is None or k[1] == path.name)]:
            del chosen[key]
    if suite.reference:
        mech, path = _parse_item(suite.reference, mechs)
        path = path or mech.default_path
        chosen.setdefault((mech.name, path.name), (mech, path))
    return list(chosen.values())


def reference_pair(
    suite: SpeedSuite, mechanisms: Sequence[Mechanism] | None = None
) -> tuple[str, str] | None:
    """(mechanism name, path name) of the suite's reference, or None."""
    if not suite.reference:
        return None
    mech, path = _parse_item(suite.reference, list(mechanisms or registry.MECHANISMS))
    return mech.name, (path or mech.default_path).name


def params_for(suite: SpeedSuite, mech: Mechanism) -> dict[str, Any]:
    """The mechanism's resolved parameters: defaults, then the file's, then --param's."""
    given: dict[str, Any] = {}
    for name in (mech.name, *mech.aliases):
        given.update(suite.params.get(name, {}))
    given.update({k: v for k, v in suite.common_params.items() if k in mech.param_names})
    return mech.resolve(given)
