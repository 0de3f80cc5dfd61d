"""``attnbench run entropy``: the theory behind Attention-E, checked (Su 2021).

The entropy of an attention row is H = -sum_j a_j log a_j. Su 2021 approximates, for q, k of
norm sqrt(d) with k uniform on the sphere, H ~ log n - 0.24 * lambda * d + O(1) (lambda the score
scale), and picks lambda = log_512(n) / sqrt(d) (Attention-E) so that H stops growing like log n.

(a) Random q, k of norm sqrt(d) (d = 64 by default), n = 16 .. 4096 in powers of two, for O
    (lambda = 1/sqrt(d)) and E (lambda = log_512 n / sqrt(d)). Fits, over all those points,
    H = log n - c * lambda * d + b (c and b free) and reports c beside Su 2021's 0.24.
(b) Inside the trained models of ``attnbench run extrapolate`` (every finished checkpoint found
    whose attention rows are distributions: O, E, ...): the mean row entropy per layer on
    held-out windows of n tokens.
For both, the growth slope dH / d log n (least squares over n) says how flat each curve is: about 1
means "grows like log n", about 0 means "entropy-invariant".
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from attnbench.data import load_corpus
from attnbench.errors import AttnbenchError
from attnbench.extrapolation.config import ExtrapConfig
from attnbench.extrapolation.evaluate import EntropyProbe, LengthGuard, row_entropy
from attnbench.extrapolation.model import MixerSpec, ModelConfig, build_model
from attnbench.extrapolation.train import load_checkpoint
from attnbench.measure import machine
from attnbench.outputs import ensure_dir

SEED_C = 0.24  # Su 2021's Laplace-approximation constant
E_BASE = 512.0


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


@dataclass
class EntropyResult:
    rows: list[dict[str, Any]]
    fit: dict[str, Any]
    slopes: list[dict[str, Any]]
    text: str
    out: Path
    notes: list[str] = field(default_factory=list)


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
    return {
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


def model_rows(cfg: ExtrapConfig, opts: EntropyOptions, notes: list[str]) -> list[dict[str, Any]]:
    """(b): mean row entropy per layer inside every finished checkpoint in ``opts.checkpoints``
    whose attention rows are distributions (O, E, E-ln, sparse softmax patterns...), each model
    rebuilt from the config stored in its checkpoint."""
    ckpt_dir = opts.checkpoints
    if ckpt_dir is None or not ckpt_dir.is_dir():
        notes.append(f"no checkpoint folder {ckpt_dir}: the trained-model part is skipped")
        return []
    paths = sorted(ckpt_dir.glob("*-seed*.pt"))
    if not paths:
        notes.append(f"no checkpoints in {ckpt_dir}: the trained-model part is skipped")
        return []
    corpus = load_corpus(opts.corpus or cfg.run.corpus or None)
    rows = []
    for path in paths:
        ckpt = load_checkpoint(path)
        key = ckpt["key"]
        label, seed = path.stem.rsplit("-seed", 1)[0], int(key["seed"])
        if not ckpt["done"]:
            notes.append(f"{path.name} is unfinished (step {ckpt['step']}); skipped")
            continue
        if key["corpus_sha256"] != corpus.sha256:
            notes.append(f"{path.name} was trained on another corpus than {corpus.name}")
        heldout = corpus.split(key["holdout"]).heldout
        model_cfg = ModelConfig(**key["model"])
        mixer = MixerSpec(key["mixer"]["mechanism"], key["mixer"]["path"], key["mixer"]["params"])
        model = build_model(model_cfg, mixer)
        model.load_state_dict(ckpt["model"])
        model.eval()
        found = 0
        for n in lengths(opts.min_n, opts.max_n):
            windows = min(opts.model_tokens, heldout.numel()) // n
            if windows < 1:
                notes.append(f"n={n} skipped for {path.name}: the held-out text is too short")
                break
            x = heldout[: n * windows].view(windows, n).long()  # (W, n)
            with torch.no_grad(), LengthGuard(model) as guard, EntropyProbe(model) as probe:
                probe.active = True
                model(x)
                guard.expect(n)
            for layer, h in enumerate(probe.means()):
                if h is None:
                    continue
                found += 1
                rows.append(
                    {
                        "source": "model",
                        "variant": label,
                        "seed": seed,
                        "layer": layer,
                        "n": n,
                        "log_n": math.log(n),
                        "lambda_d": "",
                        "entropy": h,
                        "entropy_std": "",
                        "rows": windows * n * model_cfg.heads,
                    }
                )
        if not found:
            notes.append(
                f"{path.name}: no attention rows to measure (a layer of its own, or rows that "
                "are not probability distributions); skipped"
            )
        else:
            opts.log(f"entropy inside {path.name}: done")
    return rows


#: One colour per variant in every panel (Attention-O blue, Attention-E orange); layers of the
#: trained models are told apart by line style.
VARIANT_COLOURS = {"O": "tab:blue", "E": "tab:orange", "E-ln": "tab:green"}
LAYER_STYLES = ("-", "--", ":", "-.")


def variant_colour(variant: str) -> str:
    return VARIANT_COLOURS.get(variant, "tab:grey")


def figure(rows: list[dict[str, Any]], path: Path, dim: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    df = pd.DataFrame(rows)
    has_model = (df["source"] == "model").any()
    fig, axes = plt.subplots(1, 2 if has_model else 1, figsize=(12 if has_model else 7, 4.8))
    axes = np.atleast_1d(axes)
    rnd = df[df["source"] == "random"]
    ns = sorted(rnd["n"].unique())
    ax = axes[0]
    ax.plot(ns, np.log(ns), color="grey", linestyle=":", label="log n (uniform)")
    for variant, style in (("O", "-o"), ("E", "-s")):
        g = rnd[rnd["variant"] == variant]
        ax.plot(g["n"], g["entropy"], style, color=variant_colour(variant),
                label=f"Attention-{variant}")  # fmt: skip
    ax.set_title(f"(a) random q, k of norm sqrt(d), d = {dim}")
    if has_model:
        ax = axes[1]
        mdl = df[df["source"] == "model"]
        ns_m = sorted(mdl["n"].unique())
        ax.plot(ns_m, np.log(ns_m), color="grey", linestyle=":", label="log n (uniform)")
        layers = sorted(mdl["layer"].unique())
        for (variant, layer), g in mdl.groupby(["variant", "layer"]):
            g = g.groupby("n", as_index=False)["entropy"].agg(["mean", "std"]).reset_index()
            ax.errorbar(
                g["n"],
                g["mean"],
                yerr=g["std"].fillna(0.0),
                color=variant_colour(variant),  # the same colour as in (a); layers by style
                marker="o" if variant == "O" else "s",
                linestyle=LAYER_STYLES[layers.index(layer) % len(LAYER_STYLES)],
                capsize=2,
                label=f"{variant} layer {layer}",
            )
        ax.set_title("(b) inside the trained models (mean over seeds)")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xlabel("n (keys per row)")
        ax.set_ylabel("mean row entropy (nats)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def run_entropy(cfg: ExtrapConfig, opts: EntropyOptions) -> EntropyResult:
    if opts.dim < 2 or opts.queries < 1 or opts.trials < 1:
        raise AttnbenchError(
            f"invalid dim={opts.dim}, queries={opts.queries}, trials={opts.trials}; "
            "accepted: dim >= 2, queries >= 1, trials >= 1"
        )
    lengths(opts.min_n, opts.max_n)
    ensure_dir(opts.out, "--out folder")
    notes: list[str] = []
    rows = random_rows(opts)
    rows += model_rows(cfg, opts, notes)
    fit = fit_c(rows, opts.dim)
    slopes = growth_slopes(rows)
    pd.DataFrame(rows).to_csv(opts.out / "entropy.csv", index=False)
    figure(rows, opts.out / "entropy.png", opts.dim)
    sidecar = {
        "suite": "entropy",
        "options": {k: str(v) for k, v in vars(opts).items() if k != "log"},
        "config": cfg.plain(),
        "fit": fit,
        "growth": slopes,
        "versions": machine.versions(),
        "git": machine.git_state(),
        "notes": notes,
    }
    (opts.out / "entropy.json").write_text(json.dumps(sidecar, indent=1) + "\n")
    text = _text(fit, slopes, notes)
    return EntropyResult(rows, fit, slopes, text, opts.out, notes)


def _text(fit: dict[str, Any], slopes: list[dict[str, Any]], notes: list[str]) -> str:
    lines = [
        f"fit {fit['model']}:",
        f"  c = {fit['c']:.3f}, b = {fit['b']:.3f} (rms residual {fit['rms_residual']:.3f}); "
        f"with b = 0: c = {fit['c_without_b']:.3f}; Su 2021 derives c ~ {fit['seed_c']} "
        f"(lambda*d from {fit['lambda_d_range'][0]:.2f} to {fit['lambda_d_range'][1]:.2f})",
        f"  the Gaussian-regime formula {fit['gaussian_formula']} misses the same points by "
        f"{fit['gaussian_rms_residual']:.3f} rms",
        "growth of the entropy with n (slope of H against log n; 1 = like log n, 0 = flat):",
    ]
    for s in slopes:
        where = s["source"] + (f" layer {s['layer']}" if s["layer"] != "" else "")
        lines.append(
            f"  {s['variant'] + ' ' + where:<26} slope {s['slope_dH_dlogn']:+.3f}   H "
            f"{s['H_first']:.3f} at n={s['n_first']} -> {s['H_last']:.3f} at n={s['n_last']}"
        )
    lines += [f"note: {n}" for n in notes]
    return "\n".join(lines)
