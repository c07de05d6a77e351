"""Trainer section: what the real trainer costs over a bare training loop, and where a training step goes.

    python benchmarks/trainer.py [--quick]

Rows ``trainer vs bare loop``: steady-state images/s of ``dcl_core.training.train`` (the function
``python -m dcl_core.train`` calls), run in-process on ``preset("cpu")`` with the sizes overridden, against a
minimal for-loop over the same pieces: ``build_model`` (channels_last), the run's ``ViewAugmentation`` on the
same uint8 images (as ``InMemoryData.epoch_views`` applies it), ``build_loss`` (the same loss module, whose
forward includes its cheap q_B/similarity statistics), ``build_optimizer``, the same batch and subset — and no
gradient-norm probes, q_B histogram, metrics, checkpoints or kNN. The two alternate epoch by epoch (A B A B):
the trainer's epoch callback runs one bare epoch. Both sides are timed over whole epochs after their first
(warm-up): the trainer from leaving one epoch callback to entering the next (so its per-epoch metrics,
checkpoint and metrics.jsonl write count; the kNN monitor, which always runs after the last epoch, is
subtracted using the run's own ``eval/knn_seconds``), the bare loop around each epoch; each side's median
epoch is reported. ``ours`` is the trainer's images/s, ``baseline`` the bare loop's, and ``ratio`` = bare
images/s / trainer images/s − 1 = trainer seconds / bare seconds − 1, the trainer's overhead (goal ≤ 0.05).
The epochs are small subsets (a few seconds), so the trainer's fixed per-epoch cost (checkpoint) weighs more
here than over the cpu preset's 5000-image epoch; the note gives it, and the trainer's own
``train/images_per_s``, which counts only the epoch's steps (first batch to last optimizer step).

Rows ``step phase``: one trainer step reproduced with a timer around each phase — augmentation (index, augment,
channels_last), forward (both views through the encoder + head), loss (incl. the non-finite check), backward
(zero_grad + backward), diagnostics (the trainer's gradient-norm probe and q_B histogram / loss sums, via its
own ``grad_norm`` and ``EpochStats``) and optimizer (schedule + SGD step) — at ResNet-18 ×0.125, batch 32,
1 thread. ``ours`` is seconds per epoch of the cpu preset's 5000 pretraining images (median step phase ×
steps per epoch), ``baseline`` the whole step's (the sum of the phases' medians), ``ratio`` the phase's share
of the step. The ``kNN`` row times ``evaluate_knn`` (k=200, t=0.1) over the preset's bank (5000) and test
(1000) sets against one such epoch: ``ratio`` is the kNN monitor's cost in epochs. These rows inform; they
have no goal.

Noise: the machine is shared; a loaded machine slows both sides of a comparison, but 2-thread rows suffer most
(a busy core stalls every parallel region), so read their ratio with the epoch ranges in the note.
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from dcl_core import metric_names as M
from dcl_core.config import Config, apply_overrides, derive, preset
from dcl_core.models import SSLModel, last_block_convs
from dcl_core.training import train
from dcl_core.training.builders import InMemoryData, build_data, build_loss, build_model, build_optimizer
from dcl_core.training.epoch import EpochStats, grad_norm
from dcl_core.training.probes import evaluate_knn
from dcl_core.training.schedule import cosine_lr

try:
    from benchmarks.common import Row, markdown_table, median_time
except ModuleNotFoundError:  # run as a script: python benchmarks/trainer.py
    from common import Row, markdown_table, median_time

SECTION = "trainer"
GOAL = 0.05  # the trainer may cost at most 5% more time per epoch than the bare loop
CL = torch.channels_last
CIFAR_PER_CLASS = 5000  # CIFAR-10's training images a class: data.train_per_class for the whole set


@dataclass(frozen=True)
class Setting:
    """One trainer-vs-bare comparison: encoder width, batch, torch threads and the subset that sizes an epoch."""

    width: float
    batch: int
    threads: int
    per_class: int  # data.train_per_class: images per epoch = 10 * per_class (a few seconds per epoch)

    @property
    def label(self) -> str:
        """The setting as a row label: width, batch and threads."""
        return f"ResNet-18 x{self.width:g}, batch {self.batch}, {self.threads} thread{'s' * (self.threads > 1)}"


def bench_config(width: float, batch: int, threads: int, overrides: dict[str, object] | None = None) -> Config:
    """``preset("cpu")`` with the encoder width, batch and threads set (plus ``overrides``)."""
    values: dict[str, object] = {"model.width": width, "optim.batch_size": batch, "threads": threads}
    return apply_overrides(preset("cpu"), values | (overrides or {}))


def step_config(batch: int, tiny: bool, data_root: str | None, epochs: int, full: bool = False) -> Config:
    """The paper preset at ``batch`` with an epoch of ~20 steps (a class-balanced subset), or with ``full`` the
    whole training set (5,000 images a class; ``tiny`` keeps its subset), kNN only at the end: the GPU check's
    trainer-vs-bare rows and its profile (``benchmarks/gpu.py``, ``benchmarks/step_profile.py``)."""
    per_class = max(2 * batch, 64) if tiny else CIFAR_PER_CLASS if full else max(batch * 20 // 10, 100)
    values: dict[str, object] = {
        "optim.batch_size": batch, "data.train_per_class": per_class, "data.test_per_class": 10,
        "optim.epochs": epochs, "optim.warmup_epochs": 0.0, "eval.knn_every": 100_000, "loss.name": "dcl",
    }
    if tiny:
        values |= {"model.width": 0.125, "model.proj_hidden_dim": 32, "model.proj_dim": 16, "threads": 1}
    if data_root:
        values["data.root"] = data_root
    return apply_overrides(preset("paper"), values)


# ------------------------------------------------------------------------------------------------------------
# Trainer vs bare loop


class BareLoop:
    """A minimal training loop over the same model, augmentation, loss, optimizer and batch as ``train(cfg)``:
    no schedule, diagnostics, metrics, checkpoints or evaluation."""

    def __init__(self, cfg: Config, data: InMemoryData, device: torch.device | None = None,
                 amp_dtype: torch.dtype | None = None) -> None:
        derived = derive(cfg, 1)
        torch.manual_seed(cfg.seed)
        self.device = device or torch.device("cpu")
        self.model = build_model(cfg).to(self.device, memory_format=CL)  # type: ignore[call-overload]
        self.loss = build_loss(cfg, derived)
        self.optimizer = build_optimizer(cfg, derived, self.model)
        self.data, self.batch, self.threads, self.amp_dtype = data, cfg.optim.batch_size, cfg.threads, amp_dtype
        self.images = data.pretrain.images.to(self.device)  # resident, as the trainer keeps them on a GPU
        self.gen = torch.Generator().manual_seed(cfg.seed)

    def epoch(self) -> float:
        """One pass over the pretraining images in a random order; its wall seconds (the device synchronised)."""
        t0 = time.perf_counter()
        if self.threads > 0:
            torch.set_num_threads(self.threads)
        self.model.train()
        images, n = self.images, self.batch
        order = torch.randperm(len(images), generator=self.gen).to(self.device)
        for s in range(len(images) // n):
            view1, view2 = self.data.augment(images[order[s * n : (s + 1) * n]], self.gen)  # (n, 3, S, S) each
            with torch.autocast(self.device.type, dtype=self.amp_dtype, enabled=self.amp_dtype is not None):
                _, z = self.model(torch.cat([view1.contiguous(memory_format=CL),
                                             view2.contiguous(memory_format=CL)]))
                z1, z2 = z.chunk(2)  # (n, P) each
                loss = self.loss(z1, z2).loss
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter() - t0


@dataclass
class Interleaved:
    """Per-epoch samples of one ``train`` run with a bare-loop epoch after each of its epochs (A B A B)."""

    trainer_s: list[float]  # wall seconds of each trainer epoch after the first, kNN excluded
    bare_s: list[float]  # wall seconds of each bare epoch after the first
    reported: list[float]  # the trainer's own train/images_per_s of its measured epochs
    outside_s: list[float]  # seconds of each measured trainer epoch outside its steps (metrics, checkpoint)


class _BudgetSpentError(Exception):
    """Raised by the epoch callback to end a run early once its time budget is spent."""


def trainer_and_bare(cfg: Config, bare: BareLoop, images: int, budget_s: float) -> Interleaved:
    """Run ``train(cfg)`` in-process; its epoch callback runs one bare epoch, so the two alternate epoch by
    epoch. A trainer epoch is timed from the end of the previous callback to the start of its own. After
    ``budget_s`` seconds the run stops at the next epoch end with at least two measured epochs per side (a
    loaded machine can make 2-thread epochs ten times slower)."""
    marks: list[tuple[float, float]] = []  # (callback entered, callback left)
    history: list[dict[str, float]] = []
    bare_s: list[float] = []
    start = time.perf_counter()

    def on_epoch(epoch: int, metrics: dict[str, float], checkpoint: Path | None) -> None:
        entered = time.perf_counter()
        history.append(metrics)
        bare_s.append(bare.epoch())
        marks.append((entered, time.perf_counter()))
        if len(marks) >= 3 and marks[-1][1] - start > budget_s:
            raise _BudgetSpentError

    with tempfile.TemporaryDirectory(prefix="bench_trainer_") as out, contextlib.suppress(_BudgetSpentError):
        train(apply_overrides(cfg, {"output_dir": out}), callbacks=[on_epoch])
    measured = range(1, len(marks))  # the first epoch of each side warms up
    trainer_s = [marks[i][0] - marks[i - 1][1] - history[i].get(M.KNN_SECONDS, 0.0) for i in measured]
    reported = [history[i][M.IMAGES_PER_S] for i in measured]
    outside = [t - images / ips for t, ips in zip(trainer_s, reported, strict=True)]
    return Interleaved(trainer_s, bare_s[1:], reported, outside)


def trainer_vs_bare(setting: Setting, epochs: int, budget_s: float) -> Row:
    """One row: a ``train`` run of ``epochs`` epochs (fewer past ``budget_s`` seconds) interleaved epoch by
    epoch with the bare loop."""
    cfg = bench_config(
        setting.width,
        setting.batch,
        setting.threads,
        {
            "data.train_per_class": setting.per_class,
            "data.test_per_class": 10,  # the final kNN (subtracted) stays short
            "optim.epochs": epochs,
            "optim.warmup_epochs": 0.0,
            "eval.knn_every": 100_000,  # only after the last epoch
        },
    )
    data = build_data(cfg)
    assert isinstance(data, InMemoryData)
    images = (len(data) // setting.batch) * setting.batch  # per epoch (drop_last)
    res = trainer_and_bare(cfg, BareLoop(cfg, data), images, budget_s)
    ours = images / statistics.median(res.trainer_s)
    baseline = images / statistics.median(res.bare_s)
    overhead = baseline / ours - 1.0
    paired = statistics.median(t / b for t, b in zip(res.trainer_s, res.bare_s, strict=True)) - 1.0
    return Row(
        section=SECTION,
        name=f"trainer vs bare loop, {setting.label}",
        ours=ours,
        baseline=baseline,
        ratio=overhead,
        goal=f"overhead <= {GOAL:.0%}",
        met=overhead <= GOAL,
        unit="images/s",
        note=(
            f"ratio = bare/trainer images/s - 1 = trainer/bare epoch time - 1; median of {len(res.trainer_s)} "
            f"epochs per side of {images} images, A B A B by epoch after a warm-up epoch each; median overhead "
            f"of adjacent epoch pairs {paired:+.3f}; epochs: trainer "
            f"{min(res.trainer_s):.2f}-{max(res.trainer_s):.2f} s, bare {min(res.bare_s):.2f}-"
            f"{max(res.bare_s):.2f} s; trainer's own train/images_per_s (steps only) "
            f"{statistics.median(res.reported):.0f}; per-epoch checkpoint + metrics "
            f"{1000 * statistics.median(res.outside_s):.0f} ms"
        ),
    )


# ------------------------------------------------------------------------------------------------------------
# Where a step goes

PHASES = ("augmentation", "forward", "loss", "backward", "diagnostics", "optimizer step")


def step_phases(steps: int, warmup: int = 2, knn_reps: int = 1) -> list[Row]:
    """Per-phase seconds of the trainer's step at ResNet-18 x0.125, batch 32, 1 thread, and the kNN monitor's
    cost, both relative to one epoch of the cpu preset's pretraining set."""
    cfg = bench_config(0.125, 32, 1)
    torch.set_num_threads(1)
    data = build_data(cfg)
    assert isinstance(data, InMemoryData)
    torch.manual_seed(cfg.seed)
    model = build_model(cfg).to(memory_format=CL)
    times = timed_steps(cfg, data, model, steps, warmup)
    steps_per_epoch = len(data.pretrain.images) // cfg.optim.batch_size
    per_epoch = {p: statistics.median(times[p]) * steps_per_epoch for p in PHASES}
    epoch = sum(per_epoch.values())
    setting = f"ResNet-18 x0.125, batch 32, 1 thread, {steps_per_epoch} steps/epoch"
    rows = [
        Row(
            section=SECTION,
            name=f"step phase: {p}, {setting}",
            ours=per_epoch[p],
            baseline=epoch,
            ratio=per_epoch[p] / epoch,
            unit="s/epoch",
            note=f"{per_epoch[p] / epoch:.1%} of the step; median of {steps} steps x steps/epoch",
        )
        for p in PHASES
    ]
    return [*rows, knn_row(cfg, data, model, epoch, knn_reps, setting)]


def timed_steps(cfg: Config, data: InMemoryData, model: SSLModel, steps: int,
                warmup: int) -> dict[str, list[float]]:
    """Seconds of each of :data:`PHASES` in each of ``steps`` trainer steps of ``model`` (after ``warmup``
    untimed ones), reproduced with a timer around each phase: the trainer's loss, optimizer, probes, statistics
    and schedule, on ``data``'s pretraining images in a seeded random order."""
    derived = derive(cfg, 1)
    loss_fn = build_loss(cfg, derived)
    optimizer = build_optimizer(cfg, derived, model)
    probes = [conv.weight for conv in last_block_convs(model.backbone)]  # as the trainer's Run.probes
    images, n = data.pretrain.images, cfg.optim.batch_size
    steps_per_epoch = len(images) // n
    gen = torch.Generator().manual_seed(cfg.seed)
    order = torch.randperm(len(images), generator=gen)
    stats = EpochStats(torch.device("cpu"))
    times: dict[str, list[float]] = {p: [] for p in PHASES}
    model.train()
    for step in range(warmup + steps):
        s = step % steps_per_epoch
        t_aug = time.perf_counter()
        view1, view2 = data.augment(images[order[s * n : (s + 1) * n]], gen)  # (n, 3, S, S) each
        view1, view2 = view1.contiguous(memory_format=CL), view2.contiguous(memory_format=CL)
        t_fwd = time.perf_counter()
        _, z = model(torch.cat([view1, view2]))  # (2n, P), as SimCLR.forward
        t_loss = time.perf_counter()
        z1, z2 = z.chunk(2)
        out = loss_fn(z1, z2)
        if not torch.isfinite(out.loss.detach()):  # the trainer's LossWatch, which reads it every step on a CPU
            raise FloatingPointError("non-finite loss")
        t_bwd = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        out.loss.backward()
        t_diag = time.perf_counter()
        stats.add_gradients(grad_norm(probes), out.npc)
        stats.add_losses({"loss": out.loss.detach(), **out.diagnostics}, images=n, lr=0.0)
        t_opt = time.perf_counter()
        lr = cosine_lr(step, warmup + steps, derived.lr, 0, cfg.optim.min_lr_ratio)
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.step()
        t_end = time.perf_counter()
        if step >= warmup:
            marks = (t_aug, t_fwd, t_loss, t_bwd, t_diag, t_opt, t_end)
            for phase, begin, end in zip(PHASES, marks, marks[1:], strict=False):
                times[phase].append(end - begin)
    return times


def knn_row(cfg: Config, data: InMemoryData, model: SSLModel, epoch: float, knn_reps: int,
            setting: str) -> Row:
    """The kNN monitor's cost (``evaluate_knn`` over the bank and test sets, median of ``knn_reps``) against one
    ``epoch`` of seconds."""

    def knn() -> float:
        return evaluate_knn(
            model.backbone,
            data,
            k=cfg.eval.knn_k,
            temperature=cfg.eval.knn_temperature,
            batch_size=cfg.eval.batch_size,
            device=torch.device("cpu"),
        )

    knn_s = median_time(knn, reps=knn_reps, warmup=0)
    bank, test = len(data.labels("bank")), len(data.labels("test"))
    return Row(
        section=SECTION,
        name=f"kNN monitor (k={cfg.eval.knn_k}, t={cfg.eval.knn_temperature:g}) vs one epoch, {setting}",
        ours=knn_s,
        baseline=epoch,
        ratio=knn_s / epoch,
        unit="s",
        note=(
            f"kNN = {knn_s / epoch:.0%} of an epoch: features of {bank} bank + {test} test images, "
            f"median of {knn_reps}; why CPU studies set eval.knn_every > 1"
        ),
    )


# ------------------------------------------------------------------------------------------------------------


def run(quick: bool) -> list[Row]:
    """The section's rows: trainer vs bare loop per setting, then where a step goes and the kNN's cost."""
    threads_before = torch.get_num_threads()
    if quick:
        settings = [Setting(0.125, 32, 1, per_class=32)]  # epochs of 10 steps
        epochs, budget_s, phase_steps, knn_reps = 5, 20.0, 12, 1
    else:
        settings = [Setting(0.125, 32, threads, per_class=48) for threads in (1, 2)]  # 15 steps
        settings += [Setting(0.25, 128, threads, per_class=52) for threads in (1, 2)]  # 4 steps
        epochs, budget_s, phase_steps, knn_reps = 6, 40.0, 40, 2
    try:
        rows = [trainer_vs_bare(s, epochs, budget_s) for s in settings]
        rows += step_phases(phase_steps, knn_reps=knn_reps)
    finally:
        torch.set_num_threads(threads_before)
    return rows


if __name__ == "__main__":
    t0 = time.perf_counter()
    table = markdown_table(run(quick="--quick" in sys.argv))
    print(table)
    print(f"\n({time.perf_counter() - t0:.0f} s)")
