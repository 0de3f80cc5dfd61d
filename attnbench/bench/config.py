"""The speed suite's file read into its resolved form, :class:`SpeedSuite`.

A suite file is TOML (documented in docs/speed.md, section "Speed suite files"); the dataclasses
in :mod:`attnbench.bench.suite_keys` are the single list of accepted keys, their types, defaults
and meaning. ``--set SECTION.FIELD=VALUE`` is merged over the file before it is read
(:func:`load_suite`); the other command-line options apply after, through :func:`override`.
Mechanisms are consumed through the registry only: a suite names mechanisms (or ``"*"``, all of
them) and path kinds, never special cases.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from attnbench import registry
from attnbench.bench.suite_keys import (
    DEVICES,
    DIRECTIONS,
    DTYPES,
    MAX_LENGTH,
    MAX_ROUNDS,
    SuiteFile,
)
from attnbench.core.decode import no_decode_form
from attnbench.core.errors import AttnbenchError
from attnbench.core.spec import PATH_KINDS, Mechanism, PathSpec
from attnbench.core.varlen import parse_varlen
from attnbench.measure import machine
from attnbench.measure.gpu_timing import gpu_only_options
from attnbench.measure.timing import TimingPolicy
from attnbench.runtime.schema import read_section
from attnbench.runtime.tomlconfig import Setting, SuiteText, find_suite, load


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
    #: Decoding: new queries per call against a cache of each length (empty: self-attention).
    query_lengths: tuple[int, ...] = ()
    #: K/V heads for the mechanisms with a ``kv_heads`` parameter, one case each (empty: theirs).
    kv_heads: tuple[int, ...] = ()
    #: A packed batch's lengths (None: none), and the suite's text that gave them.
    varlen: tuple[int, ...] | None = None
    varlen_text: str = ""
    max_len: Mapping[str, int] = field(default_factory=dict)
    max_call_s: float = 0.0
    threads: int = 0
    max_threads: int = 0  # caps threads = 0's one per logical core (0: no cap)
    timing: TimingPolicy = TimingPolicy()
    matmul_size: int = 2048
    matmul_max_s: float = 1.0  # the matmul is sized down until a call takes at most this long
    copy_mib: int = 256  # decoding's memory roofline: a copy of this many MiB
    #: ``[profile]``: calls of each case run under torch.profiler (0: none), and Chrome traces.
    profile_calls: int = 0
    profile_trace: bool = False
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
        if self.threads:
            return self.threads
        cores = machine.usable_cores()  # the cores this process may run on
        return min(cores, self.max_threads) if self.max_threads else cores

    def batch_for(self, n: int) -> int:
        return max(1, self.tokens // n) if self.tokens else self.batch

    def heads_for(self, head_dim: int) -> int:
        return self.hidden // head_dim if self.hidden else self.heads

    @property
    def decoding(self) -> bool:
        """Whether the suite times decode forms (``shape.query_lengths``) instead of paths."""
        return bool(self.query_lengths)

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
                "query_lengths": list(self.query_lengths),
                "kv_heads": list(self.kv_heads),
                "varlen": list(self.varlen) if self.varlen else None,
                "varlen_text": self.varlen_text,
            },
            "limits": {"max_len": dict(self.max_len), "max_call_s": self.max_call_s},
            "timing": {
                **vars(self.timing),
                "threads": self.threads,
                "max_threads": self.max_threads,
            },  # fmt: skip
            "matmul_size": self.matmul_size,
            "matmul_max_s": self.matmul_max_s,
            "copy_mib": self.copy_mib,
            "profile": {"calls": self.profile_calls, "trace": self.profile_trace},
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


def load_suite(
    name: str, mechanisms: Sequence[Mechanism] | None = None, settings: Sequence[Setting] = ()
) -> SpeedSuite:
    """Find, parse and validate a speed suite file (``speed``, ``ci``, or a path), with
    ``settings`` (``--set SECTION.FIELD=VALUE``) merged over its data before it is checked."""
    text = load(find_suite(name)).with_settings(settings)
    return parse_suite(text, mechanisms)


def parse_suite(text: SuiteText, mechanisms: Sequence[Mechanism] | None = None) -> SpeedSuite:
    """A suite file's text, validated key by key into :class:`SuiteFile` (each error names its
    line, or the option that set it), then as a whole: the parameter tables against their
    mechanisms and every mechanism name against the registry."""
    file = read_section(text, text.data, SuiteFile)
    grid, shape, limits, timing = file.grid, file.shape, file.limits, file.timing
    mechs = list(mechanisms if mechanisms is not None else registry.MECHANISMS)
    _check_params(text, file.params, mechs)
    suite = SpeedSuite(
        name=file.name or text.path.stem,
        description=file.description,
        file=str(text.path),
        sha256=text.sha256,
        mechanisms=grid.mechanisms,
        exclude=grid.exclude,
        path_kinds=grid.path_kinds,
        device=grid.device,
        dtypes=grid.dtypes,
        directions=tuple(dict.fromkeys(grid.directions)),
        causal=tuple(dict.fromkeys(grid.causal)),
        lengths=tuple(sorted(set(grid.lengths))),
        reference=grid.reference,
        batch=shape.batch,
        tokens=shape.tokens,
        heads=shape.heads,
        hidden=shape.hidden,
        head_dims=shape.head_dims,
        query_lengths=tuple(sorted(set(shape.query_lengths))),
        kv_heads=tuple(dict.fromkeys(shape.kv_heads)),
        varlen=parse_varlen(shape.varlen),
        varlen_text=_varlen_text(shape.varlen),
        max_len=dict(limits.max_len),
        max_call_s=limits.max_call_s,
        threads=timing.threads,
        max_threads=timing.max_threads,
        timing=TimingPolicy(
            warmup_calls=timing.warmup_calls,
            warmup_s=timing.warmup_s,
            rounds=timing.rounds,
            min_rounds=timing.min_rounds,
            block_s=timing.block_s,
            group_budget_s=timing.group_budget_s,
            clock=timing.clock,
            retain_memory=timing.retain_memory,
            order=timing.order,
            l2=timing.l2,
            graph=timing.graph,
        ),
        matmul_size=timing.matmul_size,
        matmul_max_s=timing.matmul_max_s,
        copy_mib=timing.copy_mib,
        profile_calls=file.profile.calls,
        profile_trace=file.profile.trace,
        params={k: dict(v) for k, v in file.params.items()},
    )
    _check_names(text, suite, mechs)
    problem = machine_problem(suite)
    if problem is not None:
        raise text.error(*problem)
    return suite


def _varlen_text(value: Any) -> str:
    """The suite's ``varlen`` as written (a list as ``L1,L2,...``), for the sidecar."""
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    return str(value or "")


#: The typical value of each size of a case (as the suite's key): the size furthest above its
#: value is the one a refusal names.
TYPICAL_SIZES = {"shape.batch": 1, "shape.tokens": 16384, "shape.heads": 4,
                 "shape.hidden": 2048, "shape.head_dims": 64, "grid.lengths": 1024}  # fmt: skip


def machine_problem(suite: SpeedSuite) -> tuple[tuple[str, ...], str] | None:
    """What this machine cannot run at all, as (the suite key to point at, one line), else None:
    more threads than its cores, or a case whose q and output alone exceed the device's whole
    memory (an impossible request; a case that fits but runs out of memory is an ``oom``
    row). Checked when a suite is read and again after the command-line options."""
    refused = machine.threads_refused(suite.threads)
    if refused:
        return ("timing", "threads"), f"timing.threads = {suite.threads}: {refused}"
    device = _device_to_size(suite)
    memory = machine.device_memory_bytes(device) if device is not None else None
    if not memory:
        return None
    n = max(suite.lengths)
    for dtype in suite.torch_dtypes():
        itemsize = torch.empty((), dtype=dtype).element_size()
        for head_dim in suite.head_dims:
            found = _too_big(suite, n, head_dim, itemsize, memory, device.type)
            if found is not None:
                return tuple(found[0].split(".")), found[1]
    return None


def _too_big(
    suite: SpeedSuite, n: int, head_dim: int, itemsize: int, memory: int, device: str
) -> tuple[str, str] | None:
    """:func:`machine_problem`'s memory check of the cases of length ``n`` and ``head_dim``."""
    batch = ("shape.tokens", suite.tokens) if suite.tokens else ("shape.batch", suite.batch)
    heads = ("shape.hidden", suite.hidden) if suite.hidden else ("shape.heads", suite.heads)
    sizes = dict([batch, heads, ("shape.head_dims", head_dim), ("grid.lengths", n)])

    def need(s: dict[str, int]) -> float:
        b = max(1, s["shape.tokens"] // s["grid.lengths"]) if suite.tokens else s["shape.batch"]
        h = s["shape.hidden"] // s["shape.head_dims"] if suite.hidden else s["shape.heads"]
        return 2.0 * itemsize * b * h * s["grid.lengths"] * s["shape.head_dims"]

    what = (
        f"q and the output of one case alone (batch {suite.batch_for(n)} x heads "
        f"{suite.heads_for(head_dim)} x n {n} x head dim {head_dim}, {itemsize} bytes each)"
    )
    gpu = device == "cuda" and torch.cuda.is_initialized()  # else RAM: see device_memory_bytes
    has = "of GPU memory in all" if gpu else "of memory in all"
    return machine.too_big(sizes, need, what, TYPICAL_SIZES, memory, has, share=1.0, sep=" = ")


def _device_to_size(suite: SpeedSuite) -> torch.device | None:
    """The device the suite runs on, when it can be known here (a CUDA suite planned on a machine
    without a GPU, ``--list-units`` on a login node, is sized where it runs)."""
    if suite.device == "cuda" and not torch.cuda.is_available():
        return None
    return suite.torch_device()


def _check_params(text: SuiteText, params: Mapping[str, Any], mechs: Sequence[Mechanism]) -> None:
    """Every ``[params.NAME]`` table names a mechanism and holds values it accepts."""
    for name, table in params.items():
        try:
            registry.resolve(name, mechs)[0].resolve(table)
        except AttnbenchError as e:
            raise text.error(("params", name), f"[params.{name}] {e}") from None


def _check_names(text: SuiteText, suite: SpeedSuite, mechs: Sequence[Mechanism]) -> None:
    """Every mechanism (and path) the grid names, excludes or takes as reference exists."""
    for key, items in (("mechanisms", suite.mechanisms), ("exclude", suite.exclude)):
        for item in items:
            if item == "*":
                continue
            try:
                resolve_item(suite, item, mechs, role="exclude" if key == "exclude" else "run")
            except AttnbenchError as e:
                raise text.error(("grid", key), f"[grid] {key}: {e}") from None
    if suite.reference:
        try:
            resolve_item(suite, suite.reference, mechs, role="reference")
        except AttnbenchError as e:
            raise text.error(("grid", "reference"), f"[grid] reference: {e}") from None


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
            resolve_item(suite, item, mechs)
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
        if not 1 <= rounds <= MAX_ROUNDS:
            raise AttnbenchError(f"--rounds {rounds}: accepted: an integer from 1 to {MAX_ROUNDS}")
        changes["timing"] = replace(
            suite.timing, rounds=rounds, min_rounds=min(rounds, suite.timing.min_rounds)
        )
    if reference is not None:
        ref = "" if reference.lower() == "none" else reference
        if ref:
            resolve_item(suite, ref, mechs, role="reference")
        changes["reference"] = ref
    if params:
        changes["common_params"] = dict(params)
    out = replace(suite, **changes)
    resolved = resolve_device(out.device)
    if resolved.type == "cuda" and out.timing.clock == "cpu":
        raise AttnbenchError(
            "[timing] clock = 'cpu' measures CPU time, which means nothing for CUDA work; "
            "accepted with a GPU: clock = 'wall'"
        )
    refused = gpu_only_options(out.timing, resolved)
    if refused:
        raise AttnbenchError(refused)
    if any(x is not None for x in (lengths, device, dtype, threads)):
        _refuse_what_this_machine_cannot_run(out, lengths, device, dtype, threads)
    selected = select(out, mechs)
    for key in out.common_params:
        if not any(key in m.param_names for m, _ in selected):
            raise AttnbenchError(
                f"--param {key}: no selected mechanism has a parameter {key!r}; "
                "see `attnbench list` for each mechanism's parameters"
            )
    return out


def _refuse_what_this_machine_cannot_run(
    suite: SpeedSuite, lengths: str | None, device: str | None, dtype: str | None,
    threads: int | None,
) -> None:  # fmt: skip
    """:func:`machine_problem` of the suite with the command-line options applied (the file's
    own values were checked when it was read), naming the options."""
    problem = machine_problem(suite)
    if problem is None:
        return
    if problem[0] == ("timing", "threads") and threads is not None:
        raise AttnbenchError(f"--threads {threads}: {problem[1]}")
    options = (("lengths", lengths), ("dtype", dtype), ("device", device))
    given = [f"--{name} {value}" for name, value in options if value is not None]
    raise AttnbenchError(f"{', '.join(given) or 'the options given'}: {problem[1]}")


def resolve_device(name: str) -> torch.device:
    if name not in DEVICES:
        raise AttnbenchError(f"device {name!r}: accepted: {', '.join(DEVICES)}")
    return machine.resolve_device(name, "--device (or the suite's [grid] device)")


# --------------------------------------------------------------------------------------------
# What to run
# --------------------------------------------------------------------------------------------


def select(
    suite: SpeedSuite, mechanisms: Sequence[Mechanism] | None = None
) -> list[tuple[Mechanism, PathSpec]]:
    """The (mechanism, path) pairs a suite runs, in order, the reference included."""
    mechs = list(mechanisms if mechanisms is not None else registry.MECHANISMS)
    chosen: dict[tuple[str, str], tuple[Mechanism, PathSpec]] = {}

    def add(mech: Mechanism, path: PathSpec | None) -> None:
        kinds = suite.path_kinds
        if path is not None:
            paths = [path]
        elif suite.decoding:  # every decode form, or the row that says why there is none
            paths = list(mech.decode) or [no_decode_form(mech.no_decode)]
        else:
            paths = [p for p in mech.paths if p.kind in kinds]
        for p in paths:
            chosen.setdefault((mech.name, p.name), (mech, p))

    for item in suite.mechanisms:
        if item == "*":
            for mech in mechs:
                add(mech, None)
        else:
            add(*resolve_item(suite, item, mechs))
    for item in suite.exclude:
        mech, path = resolve_item(suite, item, mechs, role="exclude")
        for key in [k for k in chosen if k[0] == mech.name and (path is None or k[1] == path.name)]:
            del chosen[key]
    if suite.reference:
        mech, path = resolve_item(suite, suite.reference, mechs, role="reference")
        path = path or _default(suite, mech)
        chosen.setdefault((mech.name, path.name), (mech, path))
    return list(chosen.values())


def resolve_item(
    suite: SpeedSuite, text: str, mechanisms: Sequence[Mechanism], *, role: str = "run"
) -> tuple[Mechanism, PathSpec | None]:
    """``NAME`` or ``NAME:PATH`` as the suite means it: a decode form when the suite decodes
    (``shape.query_lengths``), else a path. ``role``: how a decoding suite reads one of the
    mechanism's paths (a file written for the prefill shape, decoded with ``--set``): as the
    reference (``reference``), the mechanism's first decode form; as an exclusion
    (``exclude``), nothing (returned as the mechanism and its path, which no decode case has);
    a path asked to run is an error naming the decode forms."""
    if not suite.decoding:
        return registry.resolve(text, mechanisms)
    name, _, path = (part.strip() for part in text.partition(":"))
    mech, _ = registry.resolve(name, mechanisms)
    if path and role != "run" and path in mech.path_names and path not in _decode_names(mech):
        return mech, (None if role == "reference" else mech.path(path))
    return mech, (mech.decode_path(path) if path else None)


def _decode_names(mech: Mechanism) -> list[str]:
    return [p.name for p in mech.decode]


def _default(suite: SpeedSuite, mech: Mechanism) -> PathSpec:
    """The path a suite's reference means when it names none: the mechanism's default path, or
    when decoding its first decode form."""
    if suite.decoding:
        return mech.decode[0] if mech.decode else no_decode_form(mech.no_decode)
    return mech.default_path


def reference_pair(
    suite: SpeedSuite, mechanisms: Sequence[Mechanism] | None = None
) -> tuple[str, str] | None:
    """(mechanism name, path name) of the suite's reference, or None."""
    if not suite.reference:
        return None
    mechs = list(mechanisms or registry.MECHANISMS)
    mech, path = resolve_item(suite, suite.reference, mechs, role="reference")
    return mech.name, (path or _default(suite, mech)).name


def params_for(suite: SpeedSuite, mech: Mechanism) -> dict[str, Any]:
    """The mechanism's resolved parameters: defaults, then the file's, then --param's."""
    given: dict[str, Any] = {}
    for name in (mech.name, *mech.aliases):
        given.update(suite.params.get(name, {}))
    given.update({k: v for k, v in suite.common_params.items() if k in mech.param_names})
    return mech.resolve(given)
