"""What a study will cost before it runs (``--dry-run``): its trials, their work, and estimated CPU and GPU time.

The work of a trial is counted exactly from its config: epochs × full batches of pretraining images
(:func:`~dcl_core.training.schedule.steps_per_epoch`), and a kNN evaluation (backbone forwards over the labeled
train and test images, then a test × bank similarity matrix) every ``eval.knn_every`` epochs and after the
last. Its FLOPs are counted over the trial's own model on the meta device (:mod:`dcl_core.study.plan.flops`).

Times are estimates from those FLOPs: on the CPU at a rate measured right now on this machine
(:func:`~dcl_core.study.plan.flops.measure_flop_rate`: a few timed training steps of the same model on random
images, with the trial's threads), on a GPU at an assumed throughput (:data:`GPU_PEAK_FLOPS` ×
:data:`GPU_UTILIZATION`). The assumptions are named constants here and :func:`assumption_lines` states them to
the user.

Everything but :func:`data_sizes` (which may list an ImageFolder's files) is a function of the values it
receives; nothing here starts Ray, imports it, or writes a file.
"""

from __future__ import annotations

import heapq
import math
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dcl_core.config import Config, apply_overrides
from dcl_core.data import DataError, split_location
from dcl_core.data.packed import read_split
from dcl_core.study.plan.flops import ModelFlops, train_flops_per_image
from dcl_core.study.plan.run_options import DDP_TRIAL_CPU, Resources
from dcl_core.study.plan.spec import StudySpec, grid_points, tune_experiments
from dcl_core.training.schedule import steps_per_epoch
from search_spaces import Choice, Conditional, Grid, LogUniform, Space, keys_of

# ---------------------------------------------------------------------------------------------- assumptions

# NVIDIA A100 datasheet: 312 TFLOP/s dense FP16/BF16 tensor-core peak (624 only with 2:4 sparsity, unused here).
# The trainer runs fp16 autocast on CUDA (``amp``), so this is the peak that applies.
GPU_NAME = "A100"
GPU_PEAK_FLOPS = 312e12
# The fraction of that peak a training run achieves. ResNet-50 with AMP and channels_last trains at ~2,600
# images/s on one A100 (timm's benchmark, huggingface/pytorch-image-models#1491); at 24.3 GFLOP per image
# (FlopCounterMode: forward + backward at 224 px, as counted here) that is ~63 TFLOP/s, i.e. ~20% of peak.
# Small 32-px convolutions (CIFAR) use a GPU less well, so their GPU-hours are optimistic.
GPU_UTILIZATION = 0.20
# Outside its epochs a trial builds its data and model, checkpoints and reports: trials reuse their Ray actor,
# so no per-trial imports. Measured on the 40-trial CPU-default temperature sweep (benchmarks/studies.py
# --study-dir): trial setup, worker start-up, checkpoints and trial end sum to ~25 s of slot time, ~0.6 s a trial;
# rounded up to 1 s. Ray and MLflow start once per study (~10 s), not counted.
TRIAL_STARTUP_S = 1.0
# Full split sizes of the datasets torchvision reads: CIFAR-10/100 have 50,000 train and 10,000 test images
# (Krizhevsky 2009); STL-10 has 5,000 labeled train, 100,000 unlabeled (pretraining uses both) and 8,000 test
# images (Coates et al. 2011). As (pretraining, labeled train, test, classes).
FULL_SPLITS: dict[str, tuple[int, int, int, int]] = {
    "cifar10": (50_000, 50_000, 10_000, 10),
    "cifar100": (50_000, 50_000, 10_000, 100),
    "stl10": (105_000, 5_000, 8_000, 10),
}
# An ImageFolder this machine cannot read is assumed to be ImageNet-1K (ILSVRC-2012, Russakovsky et al. 2015):
# 1,281,167 train and 50,000 validation images in 1,000 classes. ImageNet-100 is about a tenth of it.
IMAGENET_SPLITS = (1_281_167, 1_281_167, 50_000, 1000)
# Config keys a search may sample without changing a trial's cost; any other sampled key is counted at its
# base value and flagged.
COST_FREE_PREFIXES = ("loss.", "optim.base_lr", "optim.momentum", "optim.weight_decay", "optim.warmup_epochs",
                      "optim.min_lr_ratio", "seed", "framework.momentum", "eval.knn_k", "eval.knn_temperature")


def assumption_lines() -> list[str]:
    """The estimate's assumptions, one sentence each, as the dry run prints them."""
    return [
        "FLOPs: torch.utils.flop_counter.FlopCounterMode over each trial's model on the meta device (matrix "
        "multiplies and convolutions only, 2 FLOPs per multiply-add; batch norm, activations, the loss and the "
        "optimizer are not counted); per training image: forward + backward of both views (plus the key "
        "encoder's forward of both for moco/simo); per kNN evaluation: a backbone forward of every labeled "
        "train and test image, plus the test x train similarity matrix",
        f"CPU: FLOPs / the rate measured now (a few training steps on random images, torch threads = the "
        f"trial's whole CPUs per worker; the machine's current load included), the kNN forwards at the same "
        f"rate; DDP workers split a trial's work evenly; + {TRIAL_STARTUP_S:g} s start-up per trial ("
        "data decoding, checkpoints); Ray and MLflow start-up, data augmentation and logging not counted; "
        "trials of one experiment run in order on the concurrent slots, experiments one after another",
        f"GPU: FLOPs at {GPU_NAME} {GPU_PEAK_FLOPS / 1e12:g} TFLOP/s (dense fp16/bf16 tensor-core peak, "
        f"datasheet) x {GPU_UTILIZATION:.0%} utilization (ResNet-50 AMP training reaches ~2,600 img/s on one "
        "A100 in timm's benchmark); data loading assumed to keep up",
    ]


def knn_evaluations(epochs: int, knn_every: int) -> int:
    """How many times the kNN monitor runs: after every ``knn_every``-th epoch and after the last."""
    return epochs // knn_every + (1 if epochs % knn_every else 0)


# ------------------------------------------------------------------------------------------------- data


@dataclass(frozen=True)
class DataSizes:
    """Images a trial uses: pretraining (per epoch, before dropping the last partial batch), the labeled
    train split (the kNN bank) and the test split; ``source`` says where the counts come from."""

    pretrain: int
    bank: int
    test: int
    source: str


def _count_files(split_dir: Path) -> tuple[int, int]:
    """(classes, files) of an ImageFolder split: class folders and the files in them."""
    classes = files = 0
    with os.scandir(split_dir) as entries:
        for entry in entries:
            if entry.is_dir():
                classes += 1
                with os.scandir(entry.path) as inside:
                    files += sum(1 for f in inside if f.is_file())
    return classes, files


def data_sizes(dataset: str, root: str | None, train_per_class: int, test_per_class: int) -> DataSizes:
    """How many images a trial of this data config trains and evaluates on, without loading any: the
    class-balanced subsets' ``per_class`` × classes, else the dataset's full splits (:data:`FULL_SPLITS`). An
    ImageFolder is counted on disk (class folders and files) if ``root`` is readable here, and is otherwise
    assumed to be ImageNet-1K (:data:`IMAGENET_SPLITS`)."""
    if dataset in FULL_SPLITS:
        pretrain, bank, test, classes = FULL_SPLITS[dataset]
        source = f"{dataset} split sizes"
        bank_n = train_per_class * classes if train_per_class > 0 else bank
        test_n = test_per_class * classes if test_per_class > 0 else test
        # STL-10 pretrains on train + unlabeled whatever the labeled subset; the others on the labeled subset.
        return DataSizes(pretrain if dataset == "stl10" else bank_n, bank_n, test_n, source)
    try:
        kind, train_dir = split_location(dataset, "train", root)
        if kind == "packed":  # one file (dcl_core.data.packed): its rows
            packed_train, packed_test = read_split(train_dir, "train"), read_split(train_dir, "test")
            classes, train_files = len(packed_train.classes), len(packed_train.names)
            test_files = len(packed_test.names)
            source = f"counted in {train_dir}"
        else:
            test_dir = split_location(dataset, "test", root)[1]
            classes, train_files = _count_files(train_dir)
            test_files = _count_files(test_dir)[1] if test_per_class <= 0 else 0
            source = f"counted in {train_dir.parent}"
    except (DataError, OSError):
        train_files, _, test_files, classes = IMAGENET_SPLITS
        source = "not readable here: assumed ImageNet-1K"
    bank_n = train_per_class * classes if train_per_class > 0 else train_files
    test_n = test_per_class * classes if test_per_class > 0 else test_files
    return DataSizes(bank_n, bank_n, test_n, source)


# ----------------------------------------------------------------------------------------------- trials


@dataclass(frozen=True)
class TrialWork:
    """What one trial computes, counted from its config."""

    epochs: int
    images_per_epoch: int  # full batches only (the trainer drops the last partial one)
    evaluations: int  # kNN monitor runs
    eval_images: int  # images through the backbone per evaluation (labeled train + test)
    train_flops: float
    eval_flops: float

    @property
    def train_images(self) -> int:
        """Training images over all epochs."""
        return self.epochs * self.images_per_epoch

    @property
    def flops(self) -> float:
        """Training plus evaluation FLOPs of the trial."""
        return self.train_flops + self.eval_flops


def trial_work(epochs: int, batch_size: int, workers: int, sizes: DataSizes, knn_every: int,
               image_flops: float, flops: ModelFlops) -> TrialWork:
    """A trial's images and FLOPs: ``epochs`` of full ``batch_size`` batches over ``sizes.pretrain`` images
    (split over ``workers`` DDP ranks as the trainer does), ``image_flops`` per training image
    (:func:`train_flops_per_image`), and a kNN evaluation every ``knn_every`` epochs (and after the last): a
    backbone forward of each bank and test image, and the test × bank similarity matrix."""
    per_epoch = steps_per_epoch(sizes.pretrain, batch_size, workers) * batch_size
    evaluations = knn_evaluations(epochs, knn_every)
    eval_images = sizes.bank + sizes.test
    similarity = 2.0 * sizes.test * sizes.bank * flops.feature_dim
    eval_flops = evaluations * (eval_images * flops.backbone_forward + similarity)
    return TrialWork(epochs, per_epoch, evaluations, eval_images, epochs * per_epoch * image_flops, eval_flops)


def model_key(cfg: Config) -> tuple[Any, ...]:
    """What a trial's model FLOPs and CPU rate depend on: architecture, width, stem, head and image size."""
    m = cfg.model
    return (m.arch, m.width, m.stem, m.proj_hidden_dim, m.proj_dim, cfg.data.image_size)


def describe_model(cfg: Config) -> str:
    """``resnet18 x0.125 (cifar stem), 32 px``."""
    m = cfg.model
    width = "" if m.width == 1 else f" x{m.width:g}"
    return f"{m.arch}{width} ({m.stem} stem), {cfg.data.image_size} px"


@dataclass(frozen=True)
class TrialGroup:
    """Trials of one experiment that differ only in their seed (or, for a search, in the sampled values)."""

    point: dict[str, Any]  # the grid values that name them, seed excluded
    seeds: tuple[int, ...]
    count: int
    cfg: Config  # the first trial's config (a search's trials differ in the sampled keys only)
    work: TrialWork
    flops: ModelFlops  # of its model, per image
    sizes: DataSizes


@dataclass(frozen=True)
class ExperimentPlan:
    """One Tune experiment: a grid (every point a trial) or an Optuna search of ``spec.num_samples`` trials."""

    name: str
    search: Space | None
    varied: tuple[str, ...]  # the grid's keys (seed excluded)
    fixed: dict[str, Any]  # what a search is pinned to (its grid point and constants)
    groups: list[TrialGroup]

    @property
    def trials(self) -> int:
        """The number of trials in the experiment."""
        return sum(g.count for g in self.groups)


def plan_study(spec: StudySpec, workers: int, sizes_of: Callable[[Config], DataSizes],
               flops_of: Callable[[Config], ModelFlops]) -> list[ExperimentPlan]:
    """Every trial the study would run, experiment by experiment, with its work. ``sizes_of`` and ``flops_of``
    give a config's :class:`DataSizes` and :class:`ModelFlops` (called once per distinct data / model)."""
    sizes: dict[tuple[Any, ...], DataSizes] = {}
    models: dict[tuple[Any, ...], ModelFlops] = {}

    def group(point: dict[str, Any], seeds: tuple[int, ...], count: int, cfg: Config) -> TrialGroup:
        d = cfg.data
        data_key = (d.dataset, d.root, d.train_per_class, d.test_per_class)
        if data_key not in sizes:
            sizes[data_key] = sizes_of(cfg)
        if model_key(cfg) not in models:
            models[model_key(cfg)] = flops_of(cfg)
        flops = models[model_key(cfg)]
        work = trial_work(cfg.optim.epochs, cfg.optim.batch_size, workers, sizes[data_key], cfg.eval.knn_every,
                          train_flops_per_image(cfg.framework.name, flops), flops)
        return TrialGroup(point, seeds, count, cfg, work, flops, sizes[data_key])

    plans = []
    for exp in tune_experiments(spec):
        varied = tuple(k for k, v in exp.grid.items() if isinstance(v, Grid) and k != "seed")
        if spec.search is not None:
            pinned = {**grid_points(exp.grid)[0], **exp.point}
            cfg = apply_overrides(spec.base, pinned)
            plans.append(ExperimentPlan(exp.name, spec.search, varied, pinned,
                                        [group(exp.point, (cfg.seed,), spec.num_samples, cfg)]))
            continue
        by_cell: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
        for point in grid_points(exp.grid):  # seeds of one cell cost the same: one config per cell
            cell = {k: v for k, v in point.items() if k != "seed"}
            by_cell.setdefault(tuple((k, repr(v)) for k, v in cell.items()), []).append(point)
        groups = []
        for points in by_cell.values():
            cfg = apply_overrides(spec.base, points[0])
            seeds = tuple(p.get("seed", cfg.seed) for p in points)
            groups.append(group({k: v for k, v in points[0].items() if k in varied}, seeds, len(points), cfg))
        plans.append(ExperimentPlan(exp.name, None, varied, {}, groups))
    return plans


def costly_search_keys(search: Space | None) -> list[str]:
    """Sampled keys that may change a trial's cost (counted at their base value): none of the studies' own."""
    return sorted(k for k in (keys_of(search) if search else set()) if not k.startswith(COST_FREE_PREFIXES))


# -------------------------------------------------------------------------------------------------- time


def trial_slots(resources: Resources, cpus: float, max_concurrent: int | None) -> int:
    """How many trials run at once on ``cpus`` CPUs (0 if one does not fit): each takes its workers' CPUs (a
    DDP trial also :data:`~dcl_core.study.plan.spec.DDP_TRIAL_CPU` itself), capped by ``--max-concurrent``."""
    own = DDP_TRIAL_CPU if resources.num_workers > 1 else 0.0
    fits = math.floor((cpus + 1e-9) / (resources.num_workers * resources.cpus_per_worker + own))
    return min(fits, max_concurrent) if max_concurrent else fits


def makespan(durations: Iterable[float], slots: int) -> float:
    """Wall-clock seconds to run jobs of ``durations`` in order on ``slots`` parallel slots, each job starting
    on the first slot free (as Tune starts its pending trials)."""
    free = [0.0] * max(1, slots)
    for d in durations:
        heapq.heappush(free, heapq.heappop(free) + d)
    return max(free)


def gpu_hours(flops: float, peak: float = GPU_PEAK_FLOPS, utilization: float = GPU_UTILIZATION) -> float:
    """GPU-hours to compute ``flops`` at ``utilization`` of ``peak`` FLOP/s."""
    return flops / (peak * utilization) / 3600


@dataclass(frozen=True)
class Estimate:
    """The study's totals and estimated times."""

    trials: int
    epochs: int
    train_images: int
    eval_images: int
    train_flops: float
    eval_flops: float
    cpu_seconds: float  # compute summed over every trial (all its workers), start-up excluded
    wall_seconds: float | None  # on this machine, trials in parallel on the slots; None if a trial does not fit
    slots: int
    gpu_hours: float


def estimate(plans: Sequence[ExperimentPlan], rates: dict[tuple[Any, ...], float], workers: int, slots: int,
             startup_s: float = TRIAL_STARTUP_S) -> Estimate:
    """Totals over ``plans`` and times: each trial's FLOPs at its model's measured CPU FLOP/s per worker
    (``rates``, by :func:`model_key`), split over its ``workers``, plus ``startup_s``; experiments one after
    another, the trials of each on ``slots`` at once (:func:`makespan`)."""
    trials = epochs = train_images = eval_images = 0
    train_flops = eval_flops = cpu = wall = 0.0
    for plan in plans:
        durations = []
        for g in plan.groups:
            w = g.work
            trials += g.count
            epochs += g.count * w.epochs
            train_images += g.count * w.train_images
            eval_images += g.count * w.evaluations * w.eval_images
            train_flops += g.count * w.train_flops
            eval_flops += g.count * w.eval_flops
            seconds = w.flops / rates[model_key(g.cfg)]
            cpu += g.count * seconds
            durations += [seconds / workers + startup_s] * g.count
        wall += makespan(durations, slots)
    return Estimate(trials, epochs, train_images, eval_images, train_flops, eval_flops, cpu,
                    wall if slots > 0 else None, slots, gpu_hours(train_flops + eval_flops))


def format_space(space: Space) -> str:
    """``loss.temperature ~ log-uniform [0.05, 1], optim.base_lr ~ ...`` (conditional keys with their condition)."""
    parts = []
    for key, dist in space.items():
        if isinstance(dist, LogUniform):
            parts.append(f"{key} ~ log-uniform [{dist.low:g}, {dist.high:g}]")
        elif isinstance(dist, Choice | Grid):
            parts.append(f"{key} in {{{', '.join(map(str, dist.values))}}}")
        elif isinstance(dist, Conditional):
            parts.append(f"{format_space(dist.params)} (if {dist.key} in {{{', '.join(map(str, dist.equals))}}})")
        else:
            parts.append(f"{key} = {dist}")
    return ", ".join(parts)
