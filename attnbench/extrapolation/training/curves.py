"""Training curves: loss and learning rate per logged step, as CSV, TensorBoard and a figure.

The record is the checkpoint's ``history`` (:class:`CurvePoint`, every ``log_every`` steps). Each
training writes it as it goes to ``<checkpoints>/curves/<variant>-seed<k>.csv`` (beside the
checkpoint it belongs to, so two processes sharing a checkpoint folder never write the same file),
one flushed row per point: an interrupted run keeps every point it logged. A resumed training first
rewrites that file from its checkpoint's history (the points up to the checkpoint's step), then
appends: points logged after the checkpoint by the run that died are dropped and logged again, never
twice. The run then gathers the curves of all its trainings into one tidy ``<out>/curves.csv``
(columns :data:`COLUMNS`) that ``attnbench plot`` draws.

With a TensorBoard folder, each training also writes ``train/loss``, ``train/lr`` and
``train/tokens_per_s`` scalars to ``<dir>/<variant>-seed<k>/`` with
``torch.utils.tensorboard.SummaryWriter``, the same points as the CSV: every start purges that
folder's earlier events (``purge_step=0``) and writes the checkpoint's history again, so a resumed
run shows each step once there too. TensorBoard is optional: asking for it without the package
installed is an error that says ``pip install tensorboard``.
"""

from __future__ import annotations

import csv
import importlib.util
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, NamedTuple, TextIO

from attnbench.core.errors import AttnbenchError
from attnbench.extrapolation.training.options import TrainConfig, lr_at
from attnbench.runtime.outputs import atomic_open, save_figure

#: Steps between the points kept in a checkpoint's history (and logged to the training curves).
HISTORY_EVERY = 50


class CurvePoint(NamedTuple):
    """One logged step. A checkpoint's history holds these as plain tuples; checkpoints written
    before the curves existed hold (step, loss) pairs (see ``curves.history_points``)."""

    step: int
    loss: float  # the loss of this step's batch (not smoothed)
    lr: float  # the learning rate this step used
    tokens_per_s: float  # training tokens per second since the previous logged point
    train_time_s: float  # training time up to this step, earlier runs of a resumed one included
    #: Mean masked-token loss on the fixed held-out probe (:class:`HeldoutProbe`); NaN at the
    #: steps where it was not measured (and in checkpoints from before it existed).
    heldout_loss: float = math.nan


COLUMNS = ("variant", "seed", "step", "loss", "lr", "tokens_per_s", "train_time_s",
           "heldout_loss")  # fmt: skip
#: The columns that make a CSV a curves CSV (what ``attnbench plot`` looks for).
REQUIRED = ("variant", "seed", "step", "loss")
CURVES_DIR = "curves"
COMBINED_NAME = "curves.csv"
FIGURE_NAME = "training_curves"
FORMATS = ("png", "svg")


# --------------------------------------------------------------------------------------------
# The record
# --------------------------------------------------------------------------------------------


def curve_path(checkpoint: Path) -> Path:
    """``ckpts/O-seed0.pt`` -> ``ckpts/curves/O-seed0.csv``."""
    return checkpoint.parent / CURVES_DIR / f"{checkpoint.stem}.csv"


def history_points(history: Iterable[Sequence[float]], cfg: TrainConfig) -> list[CurvePoint]:
    """A checkpoint's history as points. Checkpoints from before the curves hold (step, loss)
    pairs: their learning rate is the schedule's, their rate and time unknown (NaN)."""
    points = []
    full = len(CurvePoint._fields)
    for entry in history:
        if len(entry) >= full - 1:  # with or without the held-out loss (added later)
            points.append(CurvePoint(*entry[:full]))
        else:
            step, loss = int(entry[0]), float(entry[1])
            points.append(CurvePoint(step, loss, lr_at(step - 1, cfg), math.nan, math.nan))
    return points


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.6g}"
    return str(value)


def _row(variant: str, seed: int, point: CurvePoint) -> list[str]:
    return [variant, str(seed), *(_cell(v) for v in point)]


# --------------------------------------------------------------------------------------------
# TensorBoard
# --------------------------------------------------------------------------------------------


def tensorboard_available() -> bool:
    return importlib.util.find_spec("tensorboard") is not None


def require_tensorboard() -> None:
    if not tensorboard_available():
        raise AttnbenchError(
            "--tensorboard needs the tensorboard package, which is not installed: "
            "pip install tensorboard (or leave --tensorboard out; curves.csv is written anyway)"
        )


def summary_writer(log_dir: Path, purge_step: int) -> Any:
    """A ``torch.utils.tensorboard.SummaryWriter`` (imported only when asked for)."""
    require_tensorboard()
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(log_dir=str(log_dir), purge_step=purge_step)


# --------------------------------------------------------------------------------------------
# One training's log
# --------------------------------------------------------------------------------------------


class CurveLog:
    """The curve of one (variant, seed) training: its CSV, rewritten from the checkpoint's
    history at the start, then one flushed row per logged point; TensorBoard when asked."""

    def __init__(
        self,
        path: Path,
        variant: str,
        seed: int,
        history: Sequence[CurvePoint] = (),
        tensorboard: Path | None = None,
    ) -> None:
        self.path, self.variant, self.seed = path, variant, seed
        write_curve(path, variant, seed, history)
        self._file: TextIO = path.open("a", newline="", encoding="utf-8")
        self._csv = csv.writer(self._file)
        self._tb = None
        if tensorboard is not None:
            self._tb = summary_writer(tensorboard / path.stem, purge_step=0)
            for point in history:
                self._scalars(point)
            self._tb.flush()

    def log(self, point: CurvePoint) -> None:
        self._csv.writerow(_row(self.variant, self.seed, point))
        self._file.flush()
        if self._tb is not None:
            self._scalars(point)
            self._tb.flush()

    def _scalars(self, point: CurvePoint) -> None:
        for name in ("loss", "lr", "tokens_per_s"):
            value = getattr(point, name)
            if not math.isnan(value):
                self._tb.add_scalar(f"train/{name}", value, point.step)

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()

    def __enter__(self) -> CurveLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def write_curve(path: Path, variant: str, seed: int, points: Sequence[CurvePoint]) -> None:
    """The whole curve file at once (atomically: a reader never sees half of it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(COLUMNS)
        writer.writerows(_row(variant, seed, p) for p in points)


def combine(curve_files: Iterable[Path], out: Path) -> Path | None:
    """The curves of several trainings in one tidy CSV (files that do not exist are skipped);
    None when there is none."""
    rows: list[list[str]] = []
    for path in curve_files:
        if not path.is_file():
            continue
        with path.open(newline="", encoding="utf-8-sig") as f:
            reader = csv.reader(f)
            header = tuple(next(reader, ()))
            if header != COLUMNS[: len(header)] or not set(REQUIRED) <= set(header):
                continue  # not a curve file (one from before a column was added is kept)
            pad = [""] * (len(COLUMNS) - len(header))
            rows += [r + pad for r in reader if len(r) == len(header)]
    if not rows:
        return None
    with atomic_open(out, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(COLUMNS)
        writer.writerows(rows)
    return out


# --------------------------------------------------------------------------------------------
# The figure
# --------------------------------------------------------------------------------------------


def csv_header(path: Path) -> list[str]:
    """The first row of a CSV ([] when it cannot be read as one). Read as utf-8-sig: the
    byte-order mark a spreadsheet saves in front is not part of the first column's name."""
    try:
        with path.open(newline="", encoding="utf-8-sig") as f:
            return next(csv.reader(f), [])
    except (OSError, UnicodeDecodeError, csv.Error):
        return []


def is_curves_csv(path: Path | str) -> bool:
    """Whether a CSV is a training-curves CSV (has variant, seed, step and loss columns)."""
    path = Path(path)
    return path.is_file() and set(REQUIRED) <= set(csv_header(path))


def read_curves(path: Path | str) -> Any:
    """A curves CSV as a DataFrame, rows with a loss only; one-line errors for anything else."""
    import pandas as pd

    path = Path(path)
    if not is_curves_csv(path):
        raise AttnbenchError(
            f"{path}: not a training-curves CSV (accepted: columns {', '.join(REQUIRED)}, as "
            "written by attnbench run extrapolate to curves.csv)"
        )
    try:
        df = pd.read_csv(path, dtype={"variant": str})
        for column in ("step", "loss", *(c for c in ("lr", "heldout_loss") if c in df)):
            df[column] = pd.to_numeric(df[column])
    except (pd.errors.ParserError, ValueError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise AttnbenchError(f"{path}: malformed curves CSV ({first})") from None
    df = df[df["loss"].notna()]
    if df.empty:
        raise AttnbenchError(f"{path}: no logged steps to draw")
    return df


def plot_curves(path: Path | str, out_dir: Path | None = None, format: str = "png") -> list[Path]:
    """Loss against step (log y), one line per (variant, seed), and the learning rate below;
    written to ``out_dir`` (default: ``figures/`` beside the CSV). Returns the files written."""
    if format not in FORMATS:
        raise AttnbenchError(f"unknown format {format!r}; accepted: {', '.join(FORMATS)}")
    df = read_curves(path)
    path = Path(path)
    out_dir = out_dir or path.parent / "figures"
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"{FIGURE_NAME}.{format}"
    _draw(df, target, title=f"training curves: {path.name}")
    return [target]


def _draw(df: Any, target: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    has_lr = "lr" in df and df["lr"].notna().any()
    fig, axes = plt.subplots(
        2 if has_lr else 1,
        1,
        sharex=True,
        figsize=(8, 6 if has_lr else 4.5),
        gridspec_kw={"height_ratios": [3, 1]} if has_lr else None,
        squeeze=False,
    )
    loss_ax = axes[0][0]
    variants = list(dict.fromkeys(df["variant"]))
    colors = {v: plt.get_cmap("tab10")(i % 10) for i, v in enumerate(variants)}
    styles = ("-", "--", ":", "-.")
    for (variant, seed), curve in df.groupby(["variant", "seed"], sort=False):
        curve = curve.sort_values("step")
        style = styles[int(seed) % len(styles)] if str(seed).lstrip("-").isdigit() else "-"
        kw = {"color": colors[variant], "linestyle": style, "linewidth": 1.2}
        loss_ax.plot(curve["step"], curve["loss"], label=f"{variant} seed {seed}", **kw)
        probe = curve[curve["heldout_loss"].notna()] if "heldout_loss" in curve else curve[:0]
        if not probe.empty:
            loss_ax.plot(probe["step"], probe["heldout_loss"], marker="o", markersize=3,
                         label=f"{variant} seed {seed}, held-out", **kw)  # fmt: skip
        if has_lr:
            axes[1][0].plot(curve["step"], curve["lr"], **kw)
    loss_ax.set_yscale("log")
    plain_numbers = FuncFormatter(lambda y, _: f"{y:g}")
    loss_ax.yaxis.set_major_formatter(plain_numbers)
    loss_ax.yaxis.set_minor_formatter(plain_numbers)
    loss_ax.set_ylabel("loss (masked tokens): training; held-out (markers)")
    loss_ax.set_title(title)
    loss_ax.grid(True, which="both", alpha=0.3)
    loss_ax.legend(fontsize=8, ncol=2)
    if has_lr:
        axes[1][0].set_ylabel("learning rate")
        axes[1][0].grid(True, alpha=0.3)
    axes[-1][0].set_xlabel("step")
    fig.tight_layout()
    save_figure(fig, target)
    plt.close(fig)
