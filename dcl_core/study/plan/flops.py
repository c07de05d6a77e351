"""What a trial's model costs: FLOPs counted on the meta device and the FLOP/s this machine trains at now.

:func:`model_flops` counts with :class:`torch.utils.flop_counter.FlopCounterMode` over the trial's own model on the
meta device (no memory, no compute: shapes only), which counts matrix multiplications and convolutions (2 per
multiply-add) and nothing else, so the count scales exactly linearly with the batch. :func:`measure_flop_rate`
times a few training steps of the same model on random images, with the trial's threads. The study's plan and
estimate built from them are in :mod:`dcl_core.study.plan.cost`.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from dcl_core.config import Config
from dcl_core.models import SSLModel
from dcl_core.training.builders import build_model

log = logging.getLogger(__name__)

# One timed step does about this much work: ~0.15 s at the ~26 GFLOP/s one core reached here on the cpu-preset
# model, so the measurement stays well inside the dry run's few seconds. A model bigger than this per view is
# timed at the smallest batch, 2 views.
MEASURE_STEP_FLOPS = 4e9
MEASURE_MIN_SECONDS = 0.3  # time steps until this much has passed (one step at least, after a warm-up)
MEASURE_MAX_STEPS = 5


def count_flops(run: Callable[[], Any]) -> int:
    """FLOPs of everything ``run()`` executes (forward and, if it calls it, backward), as counted by
    :class:`~torch.utils.flop_counter.FlopCounterMode`. Works on meta tensors."""
    with FlopCounterMode(display=False) as counter:
        run()
    return int(counter.get_total_flops())


def _output_sum(out: Any) -> torch.Tensor:
    """A scalar depending on every tensor of a model's output (its features and projections), to backpropagate."""
    tensors = [t for t in (out if isinstance(out, tuple | list) else (out,)) if isinstance(t, torch.Tensor)]
    return torch.stack([t.float().sum() for t in tensors]).sum()


@dataclass(frozen=True)
class ModelFlops:
    """FLOPs of one model per image (one view) at one image size."""

    train_view: float  # forward + backward of backbone and projection head
    forward_view: float  # forward of backbone and head, no gradient (a momentum key encoder's pass)
    backbone_forward: float  # forward of the backbone alone (a kNN feature)
    feature_dim: int  # backbone features per image (the kNN similarity's inner dimension)


def model_flops(build: Callable[[], SSLModel], image_size: int, batch: int = 2) -> ModelFlops:
    """FLOPs per image of the SSL model ``build()`` (an :class:`~dcl_core.models.SSLModel`: ``backbone`` and
    ``forward -> (features, projections)``), counted on the meta device over ``batch`` square RGB images of
    ``image_size`` pixels and divided by ``batch`` (the count is linear in it). Fast for any size: no
    memory is allocated and nothing is computed."""
    with torch.device("meta"):
        model = build()
    model.train()
    x = torch.empty(batch, 3, image_size, image_size, device="meta")
    train = count_flops(lambda: _output_sum(model(x)).backward())
    with torch.no_grad():
        outputs: list[tuple[torch.Tensor, torch.Tensor]] = []
        forward = count_flops(lambda: outputs.append(model(x)))
        features = outputs[0][0]  # (batch, F)
        head = count_flops(lambda: model.head(features))  # tiny next to the backbone: cheaper than its pass
    return ModelFlops(train / batch, forward / batch, (forward - head) / batch, int(features.shape[-1]))


def train_flops_per_image(framework: str, flops: ModelFlops) -> float:
    """FLOPs of one pretraining image: both views forward + backward through the trained encoder; moco and simo
    (symmetric, their default) also pass both views through the momentum key encoder, without gradient."""
    keys = 2 * flops.forward_view if framework in ("moco", "simo") else 0.0
    return 2 * flops.train_view + keys


@dataclass(frozen=True)
class Rate:
    """A measured CPU training rate: ``flops_per_second`` over ``steps`` steps of ``views`` views."""

    flops_per_second: float
    views: int
    steps: int
    seconds: float
    threads: int


def measure_flop_rate(build: Callable[[], nn.Module], image_size: int, views: int, flops_per_view: float,
                      threads: int, min_seconds: float = MEASURE_MIN_SECONDS,
                      max_steps: int = MEASURE_MAX_STEPS) -> Rate:
    """FLOP/s of training steps (forward + backward) of ``build()`` on ``views`` random images of ``image_size``
    px, channels_last as the trainer runs it, with ``threads`` torch threads: one warm-up step (oneDNN picks
    its kernels), then steps until ``min_seconds`` have passed or ``max_steps`` ran. ``flops_per_view`` is the
    model's :attr:`ModelFlops.train_view`. The machine's other load slows it, as it would slow the study."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        model = build().to(memory_format=torch.channels_last).train()
        x = torch.randn(views, 3, image_size, image_size).contiguous(memory_format=torch.channels_last)

        def step() -> None:
            model.zero_grad(set_to_none=True)
            _output_sum(model(x)).backward()

        step()
        steps, start = 0, time.perf_counter()
        while steps < max_steps and (steps == 0 or time.perf_counter() - start < min_seconds):
            step()
            steps += 1
        seconds = time.perf_counter() - start
    finally:
        torch.set_num_threads(previous)
    rate = Rate(flops_per_view * views * steps / seconds, views, steps, seconds, threads)
    log.debug("measured %.1f GFLOP/s: %d steps of %d views in %.2f s", rate.flops_per_second / 1e9, steps, views,
              seconds)
    return rate


def measure_views(batch_size: int, workers: int, flops_per_view: float) -> int:
    """Views per timed step: the trial's per-rank step (2 views per image) if it is small, else as many as
    :data:`MEASURE_STEP_FLOPS` allows, at least 2 (batch norm needs more than one sample)."""
    return max(2, min(2 * (batch_size // workers), math.floor(MEASURE_STEP_FLOPS / flops_per_view)))


def default_flops_of(cfg: Config) -> ModelFlops:
    """:func:`model_flops` of the trial's own model (:func:`~dcl_core.training.builders.build_model`)."""
    return model_flops(lambda: build_model(cfg), cfg.data.image_size)


def default_rate_of(cfg: Config, flops: ModelFlops, workers: int, threads: int) -> Rate:
    """:func:`measure_flop_rate` of the trial's own model at a small batch (:func:`measure_views`)."""
    views = measure_views(cfg.optim.batch_size, workers, flops.train_view)
    return measure_flop_rate(lambda: build_model(cfg), cfg.data.image_size, views, flops.train_view, threads)
