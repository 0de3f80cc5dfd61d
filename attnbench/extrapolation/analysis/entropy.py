"""The theory behind Attention-E (Su 2021), as ``attnbench run entropy`` checks it.

The entropy of an attention row is H = -sum_j a_j log a_j. Su 2021 approximates, for q, k of
norm sqrt(d) with k uniform on the sphere, H ~ log n - 0.24 * lambda * d + O(1) (lambda the score
scale), and picks lambda = log_512(n) / sqrt(d) (Attention-E) so that H stops growing like log n.

(a) Random q, k of norm sqrt(d) (d = 64 by default), n = 16 .. 4096 in powers of two, for O
    (lambda = 1/sqrt(d)) and E (lambda = log_512 n / sqrt(d)). Fits, over all those points,
    H = log n - c * lambda * d + b (c and b free). Su 2021's 0.24 is the large-lambda*d slope of
    its own expression, H - log n = log E[e^{x t}] - x E[t e^{x t}] / E[e^{x t}] with x = lambda d
    and t the cosine between q and a uniform k (:func:`theory_offset`, integrated here), which is
    flatter at the lambda*d of O and E at these n (slope ~0.06-0.15 for 3.6-10.7 at d = 64): the
    fitted c is compared with that expression's slope over the same range, and a second sweep at
    n = max_n with lambda*d in SCALE_SWEEP (up to where the expression's slope reaches ~0.24 and
    beyond) fits c in Su 2021's regime. The expression is an n -> infinity limit (sums over the
    n keys replaced by expectations): at finite n it holds only while enough keys land near q,
    where the softmax mass sits. The fit therefore uses only the sweep's lambda*d up to
    :func:`approximation_bound` at that n, where a Monte Carlo of the mean finite-n entropy stays
    within FINITE_N_TOLERANCE nats of the expression (about 19 at n = 4096, d = 64); the points
    beyond stay in entropy.csv (``in_fit`` False) and the figure, outside the fit.
(b) Inside the trained models of ``attnbench run extrapolate`` (every finished checkpoint found
    whose attention rows are distributions: O, E, ...): the mean row entropy per layer on
    held-out windows of n tokens.
    The same fit of c is made per layer over the O and E models (lambda*d their nominal scale
    times d: the learned q, k norms are not sqrt(d), so c there says how the trained models'
    entropy responds to the scale, not Su 2021's constant).
For both, the growth slope dH / d log n (least squares over n) says how flat each curve is: about 1
means "grows like log n", about 0 means "entropy-invariant".
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from attnbench.core.errors import AttnbenchError
from attnbench.extrapolation.evaluation.evaluate import row_entropy
from attnbench.measure import machine

SEED_C = 0.24  # Su 2021's Laplace-approximation constant
E_BASE = 512.0
#: lambda * d of the second random sweep (n = max_n): dense up to ~24, where Su 2021's expression's
#: slope climbs to ~0.24 (0.21 at 16, 0.24 at 20, 0.27 at 24), then on to 64 to show where the
#: expression's n -> infinity approximation fails at that n.
SCALE_SWEEP = (8.0, 10.0, 12.0, 14.0, 16.0, 18.0, 20.0, 22.0, 24.0, 32.0, 48.0, 64.0)
#: Nats by which the mean entropy of rows of n random keys may depart from Su 2021's n -> infinity
#: expression for a lambda*d to count as inside the expression's domain at that n.
FINITE_N_TOLERANCE = 0.05
#: Cosines drawn per lambda*d by the Monte Carlo of the finite-n entropy (rows x n; at n = 4096,
#: 1024 rows: a standard error of about 0.01 nats where the departure nears the tolerance).
FINITE_N_DRAWS = 2**22
FINITE_N_MIN_ROWS = 64


def theory_offset(lambda_d: float, d: int, points: int = 200_001) -> float:
    """Su 2021's H - log n for a row over many keys uniform on the sphere (n -> infinity):
    log E[e^{x t}] - x E[t e^{x t}] / E[e^{x t}], x = lambda d, t = cos(q, k) with density
    proportional to (1 - t^2)^((d - 3) / 2) on (-1, 1); integrated on a grid of ``points``."""
    t = np.linspace(-1.0, 1.0, points)[1:-1]
    log_density = (d - 3) / 2 * np.log1p(-t * t)
    a = lambda_d * t + log_density
    w = np.exp(a - a.max())
    w0 = np.exp(log_density - log_density.max())
    log_mean_exp = a.max() + np.log(w.sum()) - log_density.max() - np.log(w0.sum())
    return float(log_mean_exp - lambda_d * (t * w).sum() / w.sum())


def theory_slope(low: float, high: float, d: int) -> float:
    """-(change of theory_offset) / (change of lambda d) between two lambda*d: the c that
    Su 2021's expression itself gives over that range."""
    if high <= low:
        return float("nan")
    return -(theory_offset(high, d) - theory_offset(low, d)) / (high - low)


def theory_fit_c(lambda_ds: np.ndarray, d: int) -> float:
    """The c of the least-squares line H - log n = -c * lambda d + b through Su 2021's expression
    at the given lambda*d: what the fit of :func:`fit_scale_sweep` gives on rows that follow the
    expression exactly (the secant :func:`theory_slope` only uses the two ends)."""
    x = np.asarray(lambda_ds, dtype=float)
    c, _, _ = _fit(x, np.array([theory_offset(float(v), d) for v in x]))
    return c


def sphere_cosines(rows: int, n: int, d: int, rng: np.random.Generator) -> np.ndarray:
    """[rows, n] cosines between a fixed direction and keys uniform on the sphere in d dimensions:
    (t + 1) / 2 follows Beta((d - 1) / 2, (d - 1) / 2) (the density (1 - t^2)^((d - 3) / 2))."""
    return 2.0 * rng.beta((d - 1) / 2, (d - 1) / 2, size=(rows, n)) - 1.0


def mean_row_offset(cosines: np.ndarray, lambda_d: float) -> float:
    """Mean over rows of H - log n for rows softmax(lambda_d * t) of the cosines [rows, n]: the
    entropy written as log sum e^a - sum a e^a / sum e^a (a = lambda_d t, shifted by its max)."""
    a = lambda_d * cosines
    a -= a.max(axis=1, keepdims=True)
    w = np.exp(a)
    total = w.sum(axis=1)
    entropy = np.log(total) - (a * w).sum(axis=1) / total
    return float(entropy.mean() - math.log(cosines.shape[1]))


def finite_n_cosines(n: int, d: int, seed: int = 0) -> np.ndarray:
    """The Monte Carlo's draws at length n: FINITE_N_DRAWS cosines (at least FINITE_N_MIN_ROWS
    rows of n), float64."""
    rows = max(FINITE_N_MIN_ROWS, FINITE_N_DRAWS // n)
    return sphere_cosines(rows, n, d, np.random.default_rng(seed))


def finite_n_departure(cosines: np.ndarray, lambda_d: float, d: int) -> float:
    """Mean finite-n H - log n (Monte Carlo over the rows of ``cosines``) minus Su 2021's
    n -> infinity expression at the same lambda*d: > 0 where too few of the n keys land near q,
    where the softmax mass sits, for the sums over keys to equal their expectations."""
    return mean_row_offset(cosines, lambda_d) - theory_offset(lambda_d, d)


def approximation_bound(
    n: int, d: int, high: float, tolerance: float = FINITE_N_TOLERANCE, seed: int = 0
) -> float:
    """Largest lambda*d in [0, high] at which the mean entropy of rows of n random keys stays
    within ``tolerance`` nats of Su 2021's n -> infinity expression (``high`` when it does over
    the whole range). Bisection to 0.05 on the departure, which grows with lambda*d at fixed n;
    the same draws at every lambda*d, so the departure is a smooth function of lambda*d."""
    cosines = finite_n_cosines(n, d, seed)
    if abs(finite_n_departure(cosines, high, d)) <= tolerance:
        return float(high)
    low = 0.0
    while high - low > 0.05:
        mid = (low + high) / 2
        if abs(finite_n_departure(cosines, mid, d)) <= tolerance:
            low = mid
        else:
            high = mid
    return low


@dataclass
class EntropyOptions:
    out: Path
    checkpoints: Path | None = None
    min_n: int = 16
    max_n: int = 4096
    dim: int = 64
    queries: int = 256
    trials: int = 4
    seed: int = 0
    corpus: str | None = None  # text for (b); None: the corpus the checkpoints were trained on
    model_tokens: int = 8192  # held-out tokens per length for (b), cut into windows of n
    log: Callable[[str], None] = lambda msg: None


#: float64 rows of n scores alive per query at once in (a) (the scores, scaled, their softmax, the
#: entropy's terms; measured: 2.5, peak RSS at n = 131072 with the default options).
SCORE_COPIES = 3


def random_part_bytes(opts: EntropyOptions, n: int) -> float:
    """Bytes the random part (a) holds at once at length ``n``: every trial's n keys (float64,
    one more set while a draw is normalised) and SCORE_COPIES rows of n scores per query."""
    return 8.0 * n * ((opts.trials + 1) * opts.dim + SCORE_COPIES * opts.queries)


def refuse_if_too_big(opts: EntropyOptions) -> None:
    """The random part at n = max_n must fit in memory: refused before anything is written,
    with the longest max_n that fits (else ``Cannot allocate memory`` halfway, after minutes)."""
    machine.refuse_if_too_big(
        "--max-n",
        opts.max_n,
        lambda n: random_part_bytes(opts, n),
        f"the random part holds {opts.trials} draws of n keys of dimension {opts.dim} and "
        f"{opts.queries} x n float64 scores",
        " (or fewer --trials / --queries, a smaller --dim)",
    )


def lengths(min_n: int, max_n: int) -> list[int]:
    if min_n < 2 or max_n < min_n:
        raise AttnbenchError(
            f"invalid lengths min_n={min_n}, max_n={max_n}; accepted: 2 <= min_n <= max_n"
        )
    out, n = [], min_n
    while n <= max_n:
        out.append(n)
        n *= 2
    return out


def scale(variant: str, n: int, d: int) -> float:
    """lambda: 1/sqrt(d) for O, log_512(n)/sqrt(d) for E."""
    base = 1.0 / math.sqrt(d)
    return base * math.log(n) / math.log(E_BASE) if variant == "E" else base


def nominal_lambda_d(variant: str, n: int, d: int) -> float | str:
    """lambda * d of a trained O or E model at n ('' for other variants)."""
    return scale(variant, n, d) * d if variant in ("O", "E") else ""


def sphere(count: int, d: int, gen: torch.Generator) -> torch.Tensor:
    """count vectors uniform on the sphere of radius sqrt(d): [count, d] (float64)."""
    x = torch.randn(count, d, generator=gen, dtype=torch.float64)
    return x / x.norm(dim=-1, keepdim=True) * math.sqrt(d)


def random_rows(opts: EntropyOptions) -> list[dict[str, Any]]:
    """(a): mean row entropy of softmax(lambda q.k) for random q, k, per variant and n."""
    gen = torch.Generator().manual_seed(opts.seed)
    rows = []
    for n in lengths(opts.min_n, opts.max_n):
        qs = [sphere(opts.queries, opts.dim, gen) for _ in range(opts.trials)]
        ks = [sphere(n, opts.dim, gen) for _ in range(opts.trials)]
        for variant in ("O", "E"):
            lam = scale(variant, n, opts.dim)
            hs = [
                row_entropy(torch.softmax(lam * q @ k.T, dim=-1))
                for q, k in zip(qs, ks, strict=True)
            ]
            h = torch.cat(hs)  # (trials * queries,)
            rows.append(
                {
                    "source": "random",
                    "variant": variant,
                    "seed": "",
                    "layer": "",
                    "n": n,
                    "log_n": math.log(n),
                    "lambda_d": lam * opts.dim,
                    "entropy": h.mean().item(),
                    "entropy_std": h.std().item(),
                    "rows": h.numel(),
                }
            )
    return rows


def scale_rows(opts: EntropyOptions, bound: float) -> list[dict[str, Any]]:
    """(a'): mean row entropy of softmax(lambda q.k) for random q, k at n = max_n, lambda*d in
    SCALE_SWEEP; ``in_fit`` says whether lambda*d is within ``bound``, the domain of Su 2021's
    n -> infinity expression at that n (:func:`approximation_bound`)."""
    gen = torch.Generator().manual_seed(opts.seed + 1)
    n = opts.max_n
    qs = [sphere(opts.queries, opts.dim, gen) for _ in range(opts.trials)]
    ks = [sphere(n, opts.dim, gen) for _ in range(opts.trials)]
    rows = []
    for lambda_d in SCALE_SWEEP:
        lam = lambda_d / opts.dim
        h = torch.cat([row_entropy(torch.softmax(lam * q @ k.T, dim=-1))
                       for q, k in zip(qs, ks, strict=True)])  # fmt: skip
        rows.append(
            {
                "source": "random-scale",
                "variant": "scale sweep",
                "seed": "",
                "layer": "",
                "n": n,
                "log_n": math.log(n),
                "lambda_d": lambda_d,
                "entropy": h.mean().item(),
                "entropy_std": h.std().item(),
                "rows": h.numel(),
                "in_fit": lambda_d <= bound,
            }
        )
    return rows


def _fit(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    """Least squares y = -c x + b: (c, b, rms residual)."""
    A = np.stack([-x, np.ones_like(x)], axis=1)
    (c, b), *_ = np.linalg.lstsq(A, y, rcond=None)
    return float(c), float(b), float(np.sqrt(np.mean((y - A @ np.array([c, b])) ** 2)))


def fit_scale_sweep(rows: list[dict[str, Any]], dim: int, bound: float) -> dict[str, Any] | None:
    """c fitted over the SCALE_SWEEP points with lambda*d <= ``bound`` (where Su 2021's
    n -> infinity expression holds at this n), beside the expression's own c at the same points;
    the points beyond are left out of the fit and listed. None without a sweep."""
    df = pd.DataFrame([r for r in rows if r["source"] == "random-scale"])
    if df.empty:
        return None
    n = int(df["n"].iloc[0])
    sweep = df["lambda_d"].to_numpy(dtype=float)
    inside = df[df["lambda_d"] <= bound]
    x = inside["lambda_d"].to_numpy(dtype=float)
    out: dict[str, Any] = {
        "n": n,
        "bound": bound,
        "tolerance": FINITE_N_TOLERANCE,
        "sweep_range": [float(sweep.min()), float(sweep.max())],
        "lambda_d_range": [float(x.min()), float(x.max())] if len(x) else [],
        "points": len(x),
        "outside_fit": [float(v) for v in sweep if v > bound],
        "theory_c_sweep": theory_fit_c(sweep, dim),
        "seed_c": SEED_C,
        "caveat": finite_n_caveat(df, dim, bound),
    }
    if len(x) < 2:
        out.update(c=float("nan"), b=float("nan"), rms_residual=float("nan"))
        out["theory_c"] = float("nan")
        return out
    c, b, rms = _fit(x, (inside["entropy"] - inside["log_n"]).to_numpy())
    out.update(c=c, b=b, rms_residual=rms, theory_c=theory_fit_c(x, dim))
    return out


def finite_n_caveat(sweep: pd.DataFrame, dim: int, bound: float) -> str:
    """One line: where Su 2021's n -> infinity expression stops describing rows of n keys, with
    the sweep's largest lambda*d measured against it."""
    n = int(sweep["n"].iloc[0])
    last = sweep.loc[sweep["lambda_d"].idxmax()]
    x = float(last["lambda_d"])
    measured, theory = float(last["entropy"] - last["log_n"]), theory_offset(x, dim)
    if bound >= x:
        return (
            f"at n = {n} the expression's n -> infinity approximation holds up to lambda*d = "
            f"{x:g} (within {FINITE_N_TOLERANCE} nats)"
        )
    return (
        f"beyond lambda*d ~ {bound:.1f} at n = {n} the expression's n -> infinity approximation "
        f"fails: the mean entropy of n random keys departs from it by more than "
        f"{FINITE_N_TOLERANCE} nats, as too few keys land near q, where the softmax mass sits "
        f"(at lambda*d = {x:g}: H - log n = {measured:.2f} measured, {theory:.2f} from the "
        "expression); those points are kept in entropy.csv and the figure, outside the fit"
    )


def fit_models(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per layer: H - log n = -c * (nominal lambda) d + b over the O and E models' points
    (mean over seeds), where both variants were measured."""
    df = pd.DataFrame([r for r in rows if r["source"] == "model" and r["variant"] in ("O", "E")])
    out = []
    if df.empty:
        return out
    for layer, g in df.groupby("layer", sort=True):
        g = g.groupby(["variant", "n"], as_index=False)[["log_n", "entropy", "lambda_d"]].mean()
        if g["variant"].nunique() < 2:
            continue
        x = g["lambda_d"].to_numpy(dtype=float)
        c, b, rms = _fit(x, (g["entropy"] - g["log_n"]).to_numpy())
        out.append({"layer": int(layer), "c": c, "b": b, "rms_residual": rms, "points": len(g)})
    return out


def fit_c(rows: list[dict[str, Any]], dim: int) -> dict[str, Any]:
    """Least squares of H - log n = -c * lambda*d + b over the random rows, and how far the
    Gaussian-regime formula log n - H = (lambda d)^2 / (2d) is from the same points (for small
    lambda*d, q.k is about N(0, d) and that formula, not a linear one, is the expansion)."""
    df = pd.DataFrame([r for r in rows if r["source"] == "random"])
    x = df["lambda_d"].to_numpy()
    y = (df["entropy"] - df["log_n"]).to_numpy()
    A = np.stack([-x, np.ones_like(x)], axis=1)
    (c, b), *_ = np.linalg.lstsq(A, y, rcond=None)
    resid = y - A @ np.array([c, b])
    c0 = float(-(x @ y) / (x @ x))  # with b = 0
    gauss = -(x**2) / (2 * dim)  # H - log n predicted in the Gaussian regime
    theory = np.array([theory_offset(float(v), dim) for v in x])  # H - log n, n -> infinity
    low, high = float(x.min()), float(x.max())
    step = 1e-3
    local = [-(theory_offset(v + step, dim) - theory_offset(v - step, dim)) / (2 * step)
             for v in (low, high)]  # fmt: skip
    return {
        "theory": "Su 2021's expression log E[e^{xt}] - x E[t e^{xt}] / E[e^{xt}], integrated",
        "theory_c": theory_slope(low, high, dim),
        "theory_local_c": local,
        "theory_rms_residual": float(np.sqrt(np.mean((y - theory) ** 2))),
        "model": "H = log n - c * lambda * d + b, least squares over the random O and E points",
        "c": float(c),
        "b": float(b),
        "rms_residual": float(np.sqrt(np.mean(resid**2))),
        "c_without_b": c0,
        "seed_c": SEED_C,
        "points": int(len(x)),
        "lambda_d_range": [float(x.min()), float(x.max())],
        "gaussian_formula": "H = log n - (lambda d)^2 / (2 d)",
        "gaussian_rms_residual": float(np.sqrt(np.mean((y - gauss) ** 2))),
    }


def growth_slopes(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """dH / d log n per (source, variant, layer), least squares over n (seeds averaged)."""
    df = pd.DataFrame(rows)
    out = []
    for (source, variant, layer), g in df.groupby(["source", "variant", "layer"], sort=False):
        g = g.groupby("n", as_index=False)[["log_n", "entropy"]].mean()
        if len(g) < 2:
            continue
        slope, intercept = np.polyfit(g["log_n"], g["entropy"], 1)
        out.append(
            {
                "source": source,
                "variant": variant,
                "layer": layer,
                "slope_dH_dlogn": float(slope),
                "H_first": float(g["entropy"].iloc[0]),
                "H_last": float(g["entropy"].iloc[-1]),
                "n_first": int(g["n"].iloc[0]),
                "n_last": int(g["n"].iloc[-1]),
            }
        )
    return out
