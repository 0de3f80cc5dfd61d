"""Every runnable path of every registered mechanism against the float64 oracle, on ordinary and
on extreme but legal inputs (issue 11), property-style and built from the registry, so a new
mechanism is covered without editing this file: each mechanism gets its own hypothesis test
(so none is left out by sampling), which draws direction, T, input scaling, seed and parameters
and checks every path that runs here, in each dtype of the test; one more test draws the
mechanism too, at T > 1000.

The oracle is the mechanism's reference path run in float64 on the *same* (already rounded)
inputs, as in :mod:`attnbench.core.testing`. Each drawn case asserts, for every path (the reference
run in the case's dtype included):

* finiteness: the path returns NaN/inf only where the oracle does; where the oracle's value is
  beyond the dtype's range the path must raise a clear :class:`AttnbenchError` instead (never
  silently return wrong numbers);
* the oracle bound: ``max |path - oracle| <= ORACLE_ULPS eps(dtype) scale + CONDITION_FACTOR
  probe``, where ``scale`` is the oracle's max |value| and ``probe`` is how far the oracle itself
  moves when every input is perturbed by one ulp of the dtype (random signs): what a
  backward-stable evaluation in that dtype is entitled to on ill-conditioned (extreme) inputs, a
  few ulps at unit scale. Paths that sum in the input dtype itself (float32) also get
  attnbench.core.testing's random-walk term for summing T x D products, and sqrt(T x D) probes.
* rows with no visible key (where a mechanism's parameters allow them): exactly 0.

Fused paths that cannot run on this machine are skipped (``path.unavailable``). No case is
excused: every mechanism, path, dtype and scaling the strategies draw is checked.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, assume, event, given, note, settings
from hypothesis import strategies as st

from attnbench import api, registry
from attnbench.core.errors import AttnbenchError
from attnbench.core.inputs import make_inputs
from attnbench.core.spec import Shape
from attnbench.core.testing import ACCUMULATION, SUM_ULPS, eps
from tests.helpers.cases import directions, runnable_paths

HALF = (torch.float16, torch.bfloat16)
ALL = (*HALF, torch.float32)

#: c of the oracle bound ``c eps(dtype) scale``. Inputs are exact (the oracle reads the same
#: rounded values), so a path's own error is its roundings: the scores or logits, the exp or
#: feature map, the normalising division and the cast of the result, each <= 1/2 ulp (half
#: paths sum in float32, whose rounding is ~1000x smaller), i.e. ~2 ulps of the output, and up to
#: ~2x that where the output is a weighted average of values larger than the output itself.
#: Measured: <= 2.5 ulps on every path at unit scale, T = 1..1100 (float16 and bfloat16).
ORACLE_ULPS = 8
#: Factor on the probe (the oracle's own change under a one-ulp random perturbation of every
#: input). Rounding a logit to the dtype is such a perturbation (<= 1/2 ulp, but of a
#: magnitude-|x| number), so a backward-stable path is off by about the probe, and by ~2 probes
#: where two of its roundings add up. Measured: error <= 0.6 probes (the largest, softmax and
#: AFT references in float16 with logits x50 or K and biases x20).
CONDITION_FACTOR = 2
#: Head dims: small, since the reference paths are T x T (AFT's T x T x D).
HEAD_DIM, HEAD_DIM_LONG = 8, 4
BATCH, HEADS = 1, 2
SETTINGS = dict(
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


# ------------------------------------------------------------------------------------------------
# Cases
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scaling:
    """How a case's inputs are stretched: ``q`` multiplies q (dot-product logits x q, AFT's
    sigmoid gate saturated), ``keys`` multiplies k and every learned extra input (AFT's K and
    biases: N(0, keys^2); dot-product logits x keys)."""

    name: str
    q: float = 1.0
    keys: float = 1.0


UNIT = Scaling("unit")
EXTREME = (
    Scaling("logits x50", q=50.0),
    Scaling("keys and biases x5", keys=5.0),
    Scaling("keys and biases x20", keys=20.0),
)


@dataclass
class Case:
    """One drawn call: every runnable path of ``mech`` is run on it against one oracle."""

    mech: Any
    dtype: torch.dtype
    causal: bool
    t: int
    scaling: Scaling
    seed: int
    params: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        direction = "causal" if self.causal else "bidirectional"
        return (
            f"{self.mech.name} {str(self.dtype).removeprefix('torch.')} {direction} T={self.t} "
            f"{self.scaling.name} seed={self.seed} params={self.params}"
        )

    @property
    def head_dim(self) -> int:
        return HEAD_DIM if self.t <= SHORT else HEAD_DIM_LONG

    @property
    def shape(self) -> Shape:
        return self.mech.shape_for(Shape(BATCH, HEADS, self.t, self.head_dim), self.params)

    @property
    def kwargs(self) -> dict[str, Any]:
        return {"causal": self.causal, **self.params}

    @property
    def paths(self) -> list[Any]:
        """Every path that runs on this CPU, the reference (run in the case's dtype) included."""
        return runnable_paths(self.mech, kinds=("reference", "efficient", "fused"))


#: Short cases: T in 1..SHORT with parameters drawn; long ones: T in LONG (> 1000) at default
#: parameters (small chunks or tiles would make them slow) and a smaller head dim.
SHORT, LONG = 160, (1000, 1100)


def _values_like(default: Any) -> st.SearchStrategy[Any] | None:
    """Values of the same structure as ``default`` with small positive integers (tuples of int
    pairs, as LongNet's segments), or None for types left at their default."""
    if isinstance(default, bool):
        return st.booleans()
    if isinstance(default, int):
        return st.integers(1, 16)
    if isinstance(default, tuple) and default and all(isinstance(x, tuple) for x in default):
        width = len(default[0])
        item = st.tuples(*[st.integers(1, 16)] * width)
        return st.lists(item, min_size=1, max_size=3).map(tuple)
    return None


@st.composite
def parameters(draw: st.DrawFn, mech: Any) -> dict[str, Any]:
    """Each parameter at its default or, half the time, drawn from its choices or from values
    like its default (integers 1..16); ``api.prepare`` later rejects invalid combinations."""
    out = {}
    for p in mech.params:
        values = st.sampled_from(p.choices) if p.choices else _values_like(p.default)
        if values is not None and draw(st.booleans()):
            out[p.name] = draw(values)
    return out


@st.composite
def cases(
    draw: st.DrawFn,
    mechs: st.SearchStrategy[Any],
    dtypes: tuple[torch.dtype, ...],
    scalings: tuple[Scaling, ...],
    long: bool = False,
    max_t: int = SHORT,
) -> Case:
    mech = draw(mechs)
    dtype = draw(st.sampled_from([d for d in dtypes if d in mech.dtypes] or [None]))
    assume(dtype is not None)
    t = draw(st.integers(*LONG) if long else st.integers(1, max_t))
    return Case(
        mech=mech,
        dtype=dtype,
        causal=draw(st.sampled_from(directions(mech))),
        t=t,
        scaling=draw(st.sampled_from(scalings)),
        seed=draw(st.integers(0, 2**16)),
        params={} if long else draw(parameters(mech)),
    )


class Rejected(Exception):
    """A drawn case the API refuses (an invalid parameter combination): not a failure."""


def build(case: Case) -> dict[str, torch.Tensor]:
    """The case's inputs in its dtype (drawn in float64, stretched, then rounded once), after
    validating the call as the API does."""
    try:
        case.params = case.mech.resolve(case.params)
    except AttnbenchError as e:
        raise Rejected(str(e)) from None
    x = make_inputs(case.mech, case.shape, case.params, dtype=torch.float64, seed=case.seed)
    x["q"] = x["q"] * case.scaling.q
    x["k"] = x["k"] * case.scaling.keys
    for spec in case.mech.extras_for(case.params):
        if spec.role == "parameter":
            x[spec.name] = x[spec.name] * case.scaling.keys
    x = {name: t.to(case.dtype) for name, t in x.items()}
    extras = {n: t for n, t in x.items() if n not in ("q", "k", "v")}
    try:
        api.prepare(case.mech, x["q"], x["k"], x["v"], causal=case.causal, **case.params, **extras)
    except AttnbenchError as e:
        raise Rejected(str(e)) from None
    return x


# ------------------------------------------------------------------------------------------------
# The check
# ------------------------------------------------------------------------------------------------


def probe(case: Case, oracle_inputs: dict[str, torch.Tensor], oracle: torch.Tensor) -> float:
    """How far the oracle moves when every input is perturbed by one ulp of the case's dtype,
    with random signs (finite entries only)."""
    gen = torch.Generator().manual_seed(case.seed + 1)
    unit = eps(case.dtype)
    moved = {}
    for name, x in oracle_inputs.items():
        signs = torch.randint(0, 2, x.shape, generator=gen, dtype=torch.float64) * 2 - 1
        moved[name] = x * (1 + unit * signs)
    with torch.no_grad():
        other = case.mech.reference(**moved, **case.kwargs)
    both = torch.isfinite(oracle) & torch.isfinite(other)
    return (other - oracle)[both].abs().max().item() if both.any() else 0.0


def rounding_allowance(case: Case) -> float:
    """The probe-free part of the bound, relative to the output scale: ORACLE_ULPS ulps, plus the
    random-walk error of summing a row (T x head dim products) where the path sums in the
    input dtype itself (float32; half paths sum in float32), as in attnbench.core.testing."""
    acc = ACCUMULATION[case.dtype]
    summing = SUM_ULPS * eps(acc) * math.sqrt(case.t * case.head_dim) if acc == case.dtype else 0
    return ORACLE_ULPS * eps(case.dtype) + summing


def probe_allowance(case: Case) -> float:
    """The factor on the probe: CONDITION_FACTOR, times sqrt(T x head dim) where the path sums in
    the input dtype itself (float32): there a logit is a sum of up to that many rounded terms
    (q.k over D, AFT's w_u w_v^T over its rank, a row of keys), off by ~sqrt(terms) ulps rather
    than one before the conditioning amplifies it (measured: 7 probes, aft-full's factorised
    reference in float32 with w_u, w_v x20 at T = 63)."""
    acc = ACCUMULATION[case.dtype]
    return CONDITION_FACTOR * (math.sqrt(case.t * case.head_dim) if acc == case.dtype else 1.0)


def check(
    case: Case,
    paths: list[Any] | None = None,
    *,
    empty_rows: torch.Tensor | None = None,
) -> None:
    """Every path (default: all runnable ones) against the float64 oracle: finite where the
    oracle is, a clear error where its value is beyond the dtype's range, within the bound; the
    query rows ``empty_rows`` (bool [T]: no visible key) exactly 0."""
    x = build(case)
    oracle_inputs = {name: t.double() for name, t in x.items()}
    with torch.no_grad():
        oracle = case.mech.reference(**oracle_inputs, **case.kwargs)
    finite = torch.isfinite(oracle)
    big = oracle[finite].abs().max().item() if finite.any() else 0.0
    limit = torch.finfo(case.dtype).max
    scale = big if big > 0 else 1.0  # an all-zero oracle is judged at unit scale
    moved = None  # the probe, computed only if some path needs more than the rounding part
    for path in paths if paths is not None else case.paths:
        where = f"{case.mech.name}:{path.name} on {case}"
        if big > limit:  # the defined output is not representable: only a clear error will do
            with pytest.raises(AttnbenchError):
                path(**x, **case.kwargs)
            continue
        try:
            with torch.no_grad():
                out = path(**x, **case.kwargs)
        except AttnbenchError:
            if big > limit / 2:  # at the edge of the range: refusing is fine too
                continue
            raise
        assert out.shape == oracle.shape and out.dtype == case.dtype, (where, out.shape, out.dtype)
        wrong = ~torch.isfinite(out) & finite
        assert not wrong.any(), (
            f"{where}: {int(wrong.sum())} NaN/inf outputs where the float64 oracle is finite "
            f"(first at {wrong.nonzero()[0].tolist()})"
        )
        if empty_rows is not None:
            assert (out[..., empty_rows, :] == 0).all(), f"{where}: rows with no key are not 0"
        error = (out.double() - oracle)[finite].abs().max().item() if finite.any() else 0.0
        if error <= rounding_allowance(case) * scale:
            continue
        if moved is None:
            moved = probe(case, oracle_inputs, oracle)
        allowed = rounding_allowance(case) * scale + probe_allowance(case) * moved
        assert error <= allowed, (
            f"{where}: error {error:.3g} = {error / scale:.3g} x output scale {scale:.3g} "
            f"({error / (eps(case.dtype) * scale):.3g} ulps) > allowed {allowed:.3g}; a one-ulp "
            f"perturbation of the inputs moves the oracle by {moved:.3g}"
        )


def check_drawn(
    case: Case,
    dtypes: tuple[torch.dtype, ...] | None = None,
    empty_rows: torch.Tensor | None = None,
) -> None:
    """:func:`check` for a hypothesis-drawn case, in each of ``dtypes`` the mechanism supports
    (default: the case's own); rejected cases are discarded, not failed."""
    for dtype in dtypes or (case.dtype,):
        if dtype not in case.mech.dtypes:
            continue
        one = replace(case, dtype=dtype, params=dict(case.params))
        note(str(one))
        try:
            check(one, empty_rows=empty_rows)
        except Rejected as e:
            note(f"rejected: {e}")
            assume(False)
        event(f"{str(dtype).removeprefix('torch.')} {case.scaling.name}")


# ------------------------------------------------------------------------------------------------
# Property tests
# ------------------------------------------------------------------------------------------------

NAMES = registry.names()
#: Examples per test are kept small for CI (the whole file takes ~8 s on 2 idle cores); set
#: ATTNBENCH_EXTREMES_FACTOR=N to search N times as many (same derandomized sequence, extended).
FACTOR = int(os.environ.get("ATTNBENCH_EXTREMES_FACTOR", "1"))


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=6 * FACTOR, **SETTINGS)
@given(data=st.data())
def test_half_dtypes_within_float64_oracle_bound(name, data):
    """Unit-scale inputs, T = 1..160, parameters drawn, each case in float16 and bfloat16: every
    runnable path, the reference run in the half dtype included, is within ORACLE_ULPS ulps of
    the output scale of the float64 oracle (plus the probe, a few ulps at unit scale)."""
    check_drawn(data.draw(cases(st.just(registry.get(name)), HALF, (UNIT,))), dtypes=HALF)


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=8 * FACTOR, **SETTINGS)
@given(data=st.data())
def test_extreme_inputs_stay_finite_and_within_the_oracle_bound(name, data):
    """Logits x50, or keys and learned biases of standard deviation 5 or 20 (AFT's K and w, its
    conv kernel, gamma and beta), T = 1..160, parameters drawn; each case in float16, bfloat16
    and float32."""
    check_drawn(data.draw(cases(st.just(registry.get(name)), ALL, EXTREME)), dtypes=ALL)


@settings(max_examples=12 * FACTOR, **SETTINGS)
@given(case=cases(st.sampled_from(registry.MECHANISMS), ALL, (UNIT, *EXTREME), long=True))
def test_long_sequences_stay_finite_and_within_the_oracle_bound(case):
    """T = 1000..1100 (default parameters, head dim 4), mechanism, dtype and scaling drawn."""
    check_drawn(case)


#: Mechanisms with a sparsity pattern: the ones that can leave a query row with no visible key.
PATTERNED = [
    m
    for m in registry.MECHANISMS
    if getattr(m, "visible", None) is not None or getattr(m, "pattern", None) is not None
]


@settings(max_examples=16 * FACTOR, **SETTINGS)
@given(case=cases(st.sampled_from(PATTERNED or [None]), ALL, (UNIT, *EXTREME), max_t=64))
def test_rows_with_no_visible_key(case):
    """Where a mechanism's parameters leave some query row with no visible key (LongNet's
    dilated segments), that row is exactly 0 on every path, and the rest passes the checks."""
    assume(case.mech is not None)
    try:
        case.params = case.mech.resolve(case.params)
        pattern = case.mech.pattern_matrix(case.t, case.causal, case.params)
    except AttnbenchError:
        assume(False)
    empty = ~pattern.any(-1)  # (T,)
    assume(bool(empty.any()))
    check_drawn(case, empty_rows=empty)


#: Minimal reproductions of failures these checks once found, kept as fixed examples so that they
#: stay checked whatever hypothesis draws: (mechanism, path, causal, T, scaling, seed).
FOUND = [
    # relu²(q.k) evaluated in float16 overflowed at |q.k| > 255.9 though the output is ~9000
    ("gau", "reference", False, 4, EXTREME[0], 0),
    ("flash", "reference", False, 64, EXTREME[0], 0),
    # the output itself (~88000) is beyond float16: inf was returned, now a clear error
    ("gau", "efficient", True, 7, EXTREME[0], 7),
    # elu(x) + 1 as (e^x - 1) + 1 cancelled to 0 for x < -8 (float16), -17 (float32)
    ("linear", "reference", False, 18, EXTREME[0], 2),
    ("linear", "chunkwise", True, 18, EXTREME[0], 2),
    ("linear", "compiled", True, 18, EXTREME[0], 2),
    ("linear", "compiled", False, 18, EXTREME[0], 2),
    # AFT's separate stabilisers of K and w: 0/0 in every float16 draw at std 5, T = 129
    ("aft-full", "efficient", False, 129, EXTREME[1], 0),
    ("aft-full", "efficient", True, 129, EXTREME[1], 1),
    # retention's state summed in bfloat16 drifted ~100 % of the output scale by T = 1000
    ("retention", "recurrent", True, 1000, UNIT, 0),
]


@pytest.mark.parametrize("dtype", ALL, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("found", FOUND, ids=lambda f: f"{f[0]}:{f[1]}:T={f[3]}:{f[4].name}")
def test_found_failures_stay_fixed(found, dtype):
    name, path, causal, t, scaling, seed = found
    mech = registry.get(name)
    why = mech.path(path).unavailable("cpu", mech.backward)
    if why:
        pytest.skip(f"{name}:{path} cannot run here: {why}")
    check(Case(mech, dtype, causal, t, scaling, seed), [mech.path(path)])
