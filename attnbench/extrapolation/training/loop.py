"""The training loop: the MLM encoder trained at one length by default, with checkpoints that
resume bit for bit (:mod:`attnbench.extrapolation.training.checkpoints`), on the batches of
:mod:`attnbench.extrapolation.training.batches`.

Ctrl-C or SIGTERM finishes the current step, writes a checkpoint and raises :class:`Interrupted`; a
checkpoint is also written every ``ckpt_every`` steps (what survives a SIGKILL). Files are written
atomically.

Under torchrun (:mod:`attnbench.extrapolation.training.distributed`) every process draws the same
full batch and trains on its own contiguous share of the windows: its loss is the summed
cross-entropy of its masked tokens over the whole batch's masked-token count, and the gradients are
summed over the processes, so each holds the single-process gradient (up to float reassociation) and
takes the same optimiser step. Rank 0 alone writes the checkpoints.

Every ``log_every`` steps (default HISTORY_EVERY) and at the last step, a :class:`CurvePoint`
(step, loss, learning rate, tokens per second, training time) is added to the checkpoint's
``history`` and handed to ``on_log``: the one record behind the training curves
(:mod:`attnbench.extrapolation.training.curves`).
"""

from __future__ import annotations

import contextlib
import math
import random
import signal
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from attnbench.core.errors import AttnbenchError
from attnbench.extrapolation.training.batches import (
    HeldoutProbe,
    TrainingBatches,
    masked_loss,
    share_loss,
)
from attnbench.extrapolation.training.checkpoints import CHECKPOINT_FORMAT, atomic_save, key_hash
from attnbench.extrapolation.training.curves import HISTORY_EVERY, CurvePoint
from attnbench.extrapolation.training.options import TrainConfig, check_training_options, lr_at
from attnbench.runtime.progress import Progress, Silent

if TYPE_CHECKING:
    from attnbench.extrapolation.training.distributed import DataParallel


def make_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    rest = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": rest, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.98), eps=1e-8)


class Interrupted(Exception):
    """Training stopped by Ctrl-C or SIGTERM after writing a checkpoint."""

    def __init__(self, path: Path, step: int, total: int):
        super().__init__(f"interrupted at step {step}/{total}; checkpoint {path}")
        self.path, self.step, self.total = path, step, total

    def __reduce__(self):  # crosses from a worker process to the run intact
        return (Interrupted, (self.path, self.step, self.total))


class StopFlag:
    """Set by SIGINT/SIGTERM: the loop finishes its step, saves and stops. A second Ctrl-C
    raises KeyboardInterrupt at once (and the last periodic checkpoint remains)."""

    def __init__(self) -> None:
        self.set = False

    def _handler(self, signum, frame) -> None:
        if self.set and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.set = True

    @contextlib.contextmanager
    def installed(self) -> Iterator[StopFlag]:
        old = {}
        try:
            for sig in (signal.SIGINT, signal.SIGTERM):
                old[sig] = signal.signal(sig, self._handler)
        except ValueError:  # not the main thread: no handlers, periodic checkpoints only
            pass
        try:
            yield self
        finally:
            for sig, handler in old.items():
                signal.signal(sig, handler)


@dataclass
class TrainOutcome:
    steps: int
    train_time_s: float
    final_loss: float
    tokens_per_s: float
    resumed_from: int


def train(
    model: nn.Module,
    stream: Tensor,
    cfg: TrainConfig,
    *,
    train_len: int,
    seed: int,
    path: Path,
    key: Mapping[str, Any],
    ckpt_every: int = 500,
    resume: dict[str, Any] | None = None,
    progress: Progress | None = None,
    title: str = "",
    on_step: Callable[[int], None] | None = None,
    on_log: Callable[[CurvePoint], None] | None = None,
    log_every: int = HISTORY_EVERY,
    dist: DataParallel | None = None,
    heldout: HeldoutProbe | None = None,
    causal: bool = False,
) -> TrainOutcome:
    """Train ``model`` in place (its weights already initialised from ``seed``, on the device
    it is on; batches are drawn on the CPU, so the data order is the same on every device).

    ``resume``: a loaded checkpoint of the same key to continue from. ``causal``: next-byte
    batches (the ``clm`` objective). ``on_step(step)`` is called after every completed step
    (tests use it to deliver a signal mid-run). ``on_log(point)`` is called with every point
    added to the history (every ``log_every`` steps and the last one). ``dist``: data-parallel
    over torchrun's processes (module docstring); rank 0 alone writes ``path``, every rank
    returns once it is there. ``heldout``: its loss at the first logged step at or past each
    multiple of ``heldout.every`` and at the last (``heldout_loss``; not training time)."""
    if log_every < 1:
        raise AttnbenchError(f"invalid log_every={log_every}; accepted: >= 1")
    check_training_options(cfg, train_len, model)
    progress = progress or Silent()
    sampler = TrainingBatches(stream, cfg, train_len, seed, causal)
    device = next(model.parameters()).device
    opt = make_optimizer(model, cfg)
    start, elapsed, history = _restore(resume, model, opt, sampler)

    def save(step: int, done: bool, loss: float) -> None:  # under torchrun, rank 0 alone writes
        if dist is None or dist.is_main:
            seconds = elapsed + (time.perf_counter() - t0)  # t0: moved on by the held-out probe
            state = _checkpoint(key, step, done, model, opt, sampler, seconds, loss, history)
            atomic_save(state, path)

    model.train()
    tokens_per_step = cfg.batch * train_len
    t0 = time.perf_counter()
    step, loss_value, smooth = start, float("nan"), None
    recorder = _CurveRecorder(history, heldout, on_log, tokens_per_step, start, t0, cfg)
    progress.start(title, cfg.steps, start)
    try:
        with StopFlag().installed() as stop:
            while step < cfg.steps:
                loss_value = _train_step(model, opt, sampler, cfg, step, device, dist)
                step += 1
                smooth = loss_value if smooth is None else 0.98 * smooth + 0.02 * loss_value
                run_s = time.perf_counter() - t0
                if step % log_every == 0 or step == cfg.steps:
                    lr = opt.param_groups[0]["lr"]
                    t0 += recorder.record(step, loss_value, lr, t0 + run_s, elapsed + run_s, model)
                rate = (step - start) * tokens_per_step / max(run_s, 1e-9)
                progress.advance(step, loss=smooth, tokens_per_s=rate)
                if on_step is not None:
                    on_step(step)
                if step == cfg.steps:
                    break
                if stop.set if dist is None else dist.any(stop.set):
                    save(step, False, loss_value)
                    _wait_for_main(dist)
                    raise Interrupted(path, step, cfg.steps)
                if ckpt_every and step % ckpt_every == 0:
                    save(step, False, loss_value)
            save(step, True, loss_value)
            _wait_for_main(dist)
    finally:
        progress.finish()
    run_s = time.perf_counter() - t0
    rate = (step - start) * tokens_per_step / max(run_s, 1e-9)
    return TrainOutcome(step, elapsed + run_s, loss_value, tokens_per_s=rate, resumed_from=start)


def _restore(
    resume: dict[str, Any] | None,
    model: nn.Module,
    opt: torch.optim.Optimizer,
    sampler: TrainingBatches,
) -> tuple[int, float, list]:
    """Load ``resume`` (a checkpoint, or None to start afresh) into the model, the optimiser,
    the sampler and the global generators; returns (step, training time so far, history)."""
    if resume is None:
        return 0, 0.0, []
    model.load_state_dict(resume["model"])
    opt.load_state_dict(resume["optim"])
    rng = resume["rng"]
    sampler.set_state({"windows": rng["sampler"], **rng.get("options", {})}, resume["step"])
    torch.set_rng_state(rng["torch"])
    random.setstate(_python_state(rng["python"]))
    return resume["step"], resume["train_time_s"], list(resume["history"])


def _checkpoint(key, step, done, model, opt, sampler, train_time_s, loss, history) -> dict:
    """Everything a checkpoint holds (see the module docstring)."""
    state = sampler.state()
    return {
        "format": CHECKPOINT_FORMAT,
        "key": dict(key),
        "key_hash": key_hash(key),
        "step": step,
        "done": done,
        "model": model.state_dict(),
        "optim": opt.state_dict(),
        "rng": {  # "sampler": the windows' generator; "options": those of the options on
            "sampler": state.pop("windows"),
            "options": state,
            "torch": torch.get_rng_state(),
            "python": random.getstate(),
        },
        "train_time_s": train_time_s,
        "final_loss": loss,
        "history": history,
    }


def _train_step(
    model, opt, sampler: TrainingBatches, cfg: TrainConfig, step: int, device, dist
) -> float:
    """Optimiser step ``step`` (0-based) on the next batch (this rank's share of its windows
    under torchrun); returns the batch's loss (the whole batch's, summed over the ranks)."""
    for group in opt.param_groups:
        group["lr"] = lr_at(step, cfg)
    batch = sampler.next()
    if dist is None:
        loss = masked_loss(model, *(_to(t, device) for t in batch))
    else:  # every rank draws the whole batch: the sampler stays in step everywhere
        share = dist.share(len(batch.inputs))  # this rank's windows (W depends on the length)
        loss = share_loss(model, batch[:3], share, device, batch.positions, batch.weights)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    if dist is not None:
        dist.all_reduce_gradients(model)  # now the whole batch's gradient
    if cfg.grad_clip > 0:
        nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    opt.step()
    if dist is None:
        return loss.item()
    return dist.all_reduce_sum(loss.detach().clone()).item()


class _CurveRecorder:
    """The points of one training's history (shared with its checkpoints), each handed to
    ``on_log``; the held-out probe measured at the first logged step at or past each multiple
    of its ``every`` (continuing a resumed history's count) and at the last step."""

    def __init__(self, history: list, heldout: HeldoutProbe | None, on_log, tokens_per_step: int,
                 start: int, started_at: float, cfg: TrainConfig) -> None:  # fmt: skip
        self.history, self.heldout, self.on_log = history, heldout, on_log
        self.tokens_per_step, self.cfg = tokens_per_step, cfg
        self.logged_step, self.logged_at = start, started_at
        self.next_probe = None
        if heldout is not None:  # the first multiple of ``every`` not yet measured (also on resume)
            measured = [p[0] for p in history if len(p) > 5 and not math.isnan(p[5])]
            every = heldout.every
            self.next_probe = ((measured[-1] if measured else 0) // every + 1) * every

    def record(self, step: int, loss_value: float, lr: float, now: float, train_time_s: float,
               model: nn.Module) -> float:  # fmt: skip
        """Add the point of ``step`` (``now``: its clock time); returns the seconds the held-out
        probe took (not training time: the caller moves its clock on by as much)."""
        rate = (step - self.logged_step) * self.tokens_per_step / max(now - self.logged_at, 1e-9)
        heldout_loss, probe_s = math.nan, 0.0
        if self.next_probe is not None and (step >= self.next_probe or step == self.cfg.steps):
            device = next(model.parameters()).device
            heldout_loss = self.heldout.loss(model, device, self.cfg.batch)
            self.next_probe = (step // self.heldout.every + 1) * self.heldout.every
            probe_s = time.perf_counter() - now
        point = CurvePoint(step, loss_value, lr, rate, train_time_s, heldout_loss)
        self.history.append(tuple(point))
        self.logged_step, self.logged_at = step, now + probe_s
        if self.on_log is not None:
            self.on_log(point)
        return probe_s


def _to(tensor: Tensor | None, device: torch.device) -> Tensor | None:
    return None if tensor is None else tensor.to(device, non_blocking=True)


def _wait_for_main(dist: DataParallel | None) -> None:
    """Under torchrun, every rank waits until rank 0 has written the checkpoint (they read it
    next)."""
    if dist is not None:
        dist.barrier()


def _python_state(state: Any) -> tuple:
    """random.setstate wants tuples; a checkpoint may hand back lists."""
    version, internal, gauss = state
    return (version, tuple(internal), gauss)
