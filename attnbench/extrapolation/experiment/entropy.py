"""``attnbench run entropy``: the theory behind Attention-E checked (Su 2021), on random q, k and
inside the trained models; the theory, the sweeps and the fits are
:mod:`attnbench.extrapolation.analysis.entropy`, the figure :func:`attnbench.extrapolation.analysis.
figures.entropy_figure`. Writes entropy.csv, entropy.json and entropy.png.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from attnbench.core.errors import AttnbenchError
from attnbench.data import load_corpus
from attnbench.extrapolation.analysis.entropy import (
    SCALE_SWEEP,
    EntropyOptions,
    approximation_bound,
    fit_c,
    fit_models,
    fit_scale_sweep,
    growth_slopes,
    lengths,
    nominal_lambda_d,
    random_rows,
    refuse_if_too_big,
    scale_rows,
)
from attnbench.extrapolation.analysis.figures import entropy_figure
from attnbench.extrapolation.evaluation.evaluate import EntropyProbe, LengthGuard
from attnbench.extrapolation.experiment.config import ExtrapConfig
from attnbench.extrapolation.model.encoder import MixerSpec, ModelConfig, build_model
from attnbench.extrapolation.training.checkpoints import load_checkpoint
from attnbench.measure import machine
from attnbench.runtime.outputs import ensure_dir, write_csv, write_text
from attnbench.runtime.portable import portable


@dataclass
class EntropyResult:
    rows: list[dict[str, Any]]
    fit: dict[str, Any]
    slopes: list[dict[str, Any]]
    text: str
    out: Path
    notes: list[str] = field(default_factory=list)


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
        head_dim = model_cfg.head_dim
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
                        "lambda_d": nominal_lambda_d(label, n, head_dim),
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


def run_entropy(cfg: ExtrapConfig, opts: EntropyOptions) -> EntropyResult:
    if opts.dim < 2 or opts.queries < 1 or opts.trials < 1:
        raise AttnbenchError(
            f"invalid dim={opts.dim}, queries={opts.queries}, trials={opts.trials}; "
            "accepted: dim >= 2, queries >= 1, trials >= 1"
        )
    lengths(opts.min_n, opts.max_n)
    refuse_if_too_big(opts)
    ensure_dir(opts.out, "--out folder")
    notes: list[str] = []
    rows = random_rows(opts)
    bound = approximation_bound(opts.max_n, opts.dim, high=max(SCALE_SWEEP))
    rows += scale_rows(opts, bound)
    rows += model_rows(cfg, opts, notes)
    fit = fit_c(rows, opts.dim)
    fit["seed_regime"] = fit_scale_sweep(rows, opts.dim, bound)
    fit["models"] = fit_models(rows)
    slopes = growth_slopes(rows)
    write_csv(pd.DataFrame(rows), opts.out / "entropy.csv", index=False)
    entropy_figure(rows, opts.out / "entropy.png", opts.dim, fit["seed_regime"])
    sidecar = {
        "suite": "entropy",
        "options": {k: str(v) for k, v in vars(opts).items() if k != "log"},
        "config": cfg.plain(),
        "fit": fit,
        "growth": slopes,
        "versions": machine.versions(),
        "git": machine.git_state(opts.out),
        "notes": notes,
    }
    sidecar = portable(sidecar, opts.out)  # no path of this machine in a result file
    write_text(opts.out / "entropy.json", json.dumps(sidecar, indent=1) + "\n")
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
        f"  Su 2021's own expression, integrated, gives c = {fit['theory_c']:.3f} over this range "
        f"(local slope {fit['theory_local_c'][0]:.3f} .. {fit['theory_local_c'][1]:.3f}) and "
        f"misses the points by {fit['theory_rms_residual']:.3f} rms with no free parameter: "
        "0.24 is its slope at larger lambda*d",
    ]
    if (regime := fit.get("seed_regime")) is not None:
        lines += _regime_text(regime)
    for m in fit.get("models", []):
        lines.append(
            f"fit inside the trained O and E, layer {m['layer']}: c = {m['c']:.3f} over nominal "
            f"lambda*d (rms {m['rms_residual']:.3f}, {m['points']} points)"
        )
    lines.append(
        "growth of the entropy with n (slope of H against log n; 1 = like log n, 0 = flat):"
    )
    for s in slopes:
        where = s["source"] + (f" layer {s['layer']}" if s["layer"] != "" else "")
        lines.append(
            f"  {s['variant'] + ' ' + where:<26} slope {s['slope_dH_dlogn']:+.3f}   H "
            f"{s['H_first']:.3f} at n={s['n_first']} -> {s['H_last']:.3f} at n={s['n_last']}"
        )
    lines += [f"note: {n}" for n in notes]
    return "\n".join(lines)


def _regime_text(regime: dict[str, Any]) -> list[str]:
    """The scale sweep's fit: the range used, c beside the expression's c at the same points,
    and the finite-n caveat."""
    low, high = regime["sweep_range"]
    head = f"fit in Su 2021's regime (random, n = {regime['n']}, sweep lambda*d {low:g}..{high:g}"
    if regime["points"] < 2:
        lines = [
            f"{head}): no fit, {regime['points']} point(s) inside the expression's domain "
            f"(lambda*d <= {regime['bound']:.1f}; a longer --max-n widens it)"
        ]
    else:
        used_low, used_high = regime["lambda_d_range"]
        lines = [
            f"{head}; fitted over lambda*d {used_low:g}..{used_high:g}, {regime['points']} "
            f"points): c = {regime['c']:.3f} (rms {regime['rms_residual']:.3f}); the expression "
            f"gives c = {regime['theory_c']:.3f} at the same points ({regime['theory_c_sweep']:.3f}"
            f" over the whole sweep, where n = {regime['n']} cannot follow it); Su 2021 quotes "
            f"{regime['seed_c']}, the expression's slope near lambda*d = 20"
        ]
    return [*lines, f"  caveat: {regime['caveat']}"]
