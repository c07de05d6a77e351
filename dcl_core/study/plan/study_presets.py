"""A study script's presets, typed: the config each starts from and what the study sweeps.

Every script offers ``smoke`` (tests, about a minute), ``cpu`` (its question on 2 cores in at most ~15 minutes)
and ``paper`` (the paper's protocol, for a GPU cluster); some add one (``cpu_long``). What every ``cpu`` preset
shares is defined once here (:data:`CPU_PROTOCOL`), as is the smoke data (:data:`SMOKE_DATA`); a study states only
what differs (its epochs, batch, τ, kNN cadence).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

# The CPU protocol of every study: a narrow ResNet-18 (1/8 of the channels, a 128-wide projection head) on 2,500
# CIFAR-10 training images (250 per class) and 1,000 test images, base lr 0.24 (× batch/256) after one warm-up
# epoch. Sized so a study's cells run on 2 cores within minutes; the seeds, not the schedule, decide a verdict.
CPU_PROTOCOL: Mapping[str, Any] = MappingProxyType({
    "model.width": 0.125, "model.proj_hidden_dim": 128, "data.train_per_class": 250, "data.test_per_class": 100,
    "optim.base_lr": 0.24, "optim.warmup_epochs": 1.0,
})
# The smoke data: 80 training and 40 test images (the smoke config preset's own sizes are larger).
SMOKE_DATA: Mapping[str, Any] = MappingProxyType({"data.train_per_class": 8, "data.test_per_class": 4})
PAIR = ("infonce", "dcl")  # the losses most studies compare


@dataclass(frozen=True)
class StudyPreset:
    """One preset of a study.

    Attributes:
        config: the :func:`dcl_core.config.preset` it starts from (``smoke``, ``cpu``, ``paper``,
            ``paper_imagenet``).
        overrides: dotted config keys over that preset.
        axis: the values the study sweeps (τ, batch size, σ, K, queue size, epoch budget); empty for a search.
        losses: the losses compared (``--losses`` replaces them).
        seeds: seeds per cell of a grid (``--seeds`` replaces it).
        samples: Optuna trials per loss with ``--search optuna`` (``--num-samples`` replaces it).
        variants: grids the study runs side by side, each a set of fixed overrides (few_epochs: SimCLR, MoCo-v2).
    """

    config: str
    overrides: Mapping[str, Any] = field(default_factory=dict)
    axis: tuple[Any, ...] = ()
    losses: tuple[str, ...] = PAIR
    seeds: int = 1
    samples: int = 8
    variants: tuple[Mapping[str, Any], ...] = ({},)

    @property
    def base(self) -> tuple[str, dict[str, Any]]:
        """``(config preset, overrides)``, as :func:`dcl_core.study.cli.script.base_config` takes it."""
        return self.config, dict(self.overrides)


def smoke(overrides: Mapping[str, Any], **fields: Any) -> StudyPreset:
    """A ``smoke`` preset: the smoke config on :data:`SMOKE_DATA`, then the study's ``overrides``."""
    return StudyPreset("smoke", {**SMOKE_DATA, **overrides}, **fields)


def cpu(overrides: Mapping[str, Any], *, without: tuple[str, ...] = (), **fields: Any) -> StudyPreset:
    """A CPU preset: the cpu config with :data:`CPU_PROTOCOL` (but the keys in ``without``, e.g. what the study
    searches), then the study's ``overrides``."""
    shared = {k: v for k, v in CPU_PROTOCOL.items() if k not in without}
    return StudyPreset("cpu", {**shared, **overrides}, **fields)
