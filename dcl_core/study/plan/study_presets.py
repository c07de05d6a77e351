"""A study script's presets, typed: the config each starts from and what the study sweeps.

Every script offers ``smoke`` (tests, about a minute), ``cpu`` (its question on 2 cores in at most ~15 minutes)
and ``paper`` (the paper's protocol, for a GPU cluster); some add one (``cpu_long``). What every ``cpu`` preset
shares is defined once here (:data:`CPU_PROTOCOL`), as is the smoke data (:data:`SMOKE_DATA`); a study states only
what differs (its epochs, batch, τ, kNN cadence).

A preset resolves itself against the command line (:meth:`StudyPreset.resolve`): ``--losses``, ``--seeds``,
``--num-samples``, ``--search``, ``--data-root`` and ``--set`` are read here and nowhere else, so a study's
``build_spec`` reads a :class:`PresetRun` and states only its science (what it sweeps, what Optuna searches, which
questions it asks).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from dcl_core.config import Config, ConfigError, apply_overrides, loss_label, parse_overrides, preset
from search_spaces import Grid, Space

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
        """``(config preset, overrides)``: the config this preset starts from, before the command line's."""
        return self.config, dict(self.overrides)

    def resolve(self, *, search: str, losses: str | None = None, seeds: int | None = None,
                samples: int | None = None, data_root: str | None = None,
                overrides: Sequence[str] = (), fixed_losses: str = "",
                only_search: tuple[str, str] | None = None) -> PresetRun:
        """This preset under one command line: ``--search`` (``grid`` or ``optuna``), ``--losses`` (comma-separated,
        default this preset's), ``--seeds`` and ``--num-samples`` (default this preset's), ``--data-root`` and the
        ``--set KEY=VALUE`` overrides (over this preset's config, in that order).

        A study that fixes its losses says why in ``fixed_losses`` (the refusal of ``--losses``); one that runs a
        single search mode gives it and the refusal of the other in ``only_search`` (``("optuna", why)``).

        Raises:
            ConfigError: ``--losses`` where the study fixes them, the search mode it does not run, a loss named
                twice or two losses shown alike (one line each).
        """
        if losses and fixed_losses:
            raise ConfigError(fixed_losses)
        if samples is not None and search != "optuna":  # a grid has no samples: it was ignored silently
            raise ConfigError("--num-samples is the number of trials of --search optuna; a grid runs every cell "
                              "(--seeds sets its repeats)")
        if only_search is not None and search != only_search[0]:
            raise ConfigError(only_search[1])
        config = apply_overrides(preset(self.config), {**self.overrides, **({"data.root": data_root} if data_root
                                                                               else {})})
        return PresetRun(
            preset=self, base=apply_overrides(config, parse_overrides(list(overrides))),
            losses=parse_losses(losses) if losses else self.losses, seeds=tuple(range(seeds or self.seeds)),
            samples=samples or self.samples, optuna=search == "optuna",
        )


@dataclass(frozen=True)
class PresetRun:
    """A preset resolved against one command line (:meth:`StudyPreset.resolve`): what a study's spec is built from.

    Attributes:
        preset: the preset (its ``axis`` and ``variants`` are the study's own).
        base: its config after ``--data-root`` and ``--set``.
        losses: the losses compared.
        seeds: the seeds of each grid cell (an Optuna search runs the config's seed, 0).
        samples: Optuna trials per search.
        optuna: ``--search optuna`` (else the grid).
    """

    preset: StudyPreset
    base: Config
    losses: tuple[str, ...]
    seeds: tuple[int, ...]
    samples: int
    optuna: bool

    @property
    def grid(self) -> bool:
        """``--search grid``: every cell runs, once per seed."""
        return not self.optuna

    @property
    def axis(self) -> tuple[Any, ...]:
        """The values the study sweeps."""
        return self.preset.axis

    @property
    def seed_axis(self) -> Grid:
        """The grid's seed axis, ``Grid(seeds)``."""
        return Grid(self.seeds)

    def space(self, space: Space) -> Space | None:
        """``space`` for an Optuna search, None for the grid (``StudySpec.search``)."""
        return space if self.optuna else None


def parse_losses(text: str) -> tuple[str, ...]:
    """``--losses infonce,dcl,my_losses:MyLoss`` as a tuple (a user loss's file already absolute:
    :func:`~dcl_core.study.cli.options.args_of`); a loss named twice would run every one of its trials twice, and
    two losses shown alike could not be told apart."""
    losses = tuple(x.strip() for x in text.split(","))
    if "" in losses:
        raise ConfigError(f"--losses {text!r} names an empty loss; separate the losses by single commas "
                          "(e.g. --losses infonce,dcl)")
    twice = sorted({x for x in losses if losses.count(x) > 1})
    if twice:
        raise ConfigError(f"--losses names {twice[0]} twice; each loss runs once per cell (use --seeds for repeats)")
    labels = [loss_label(x) for x in losses]
    alike = sorted({x for x in labels if labels.count(x) > 1})
    if alike:
        raise ConfigError(f"--losses: two losses would both be shown as {alike[0]}; give your loss class another "
                          "name")
    return losses


def smoke(overrides: Mapping[str, Any], **fields: Any) -> StudyPreset:
    """A ``smoke`` preset: the smoke config on :data:`SMOKE_DATA`, then the study's ``overrides``."""
    return StudyPreset("smoke", {**SMOKE_DATA, **overrides}, **fields)


def cpu(overrides: Mapping[str, Any], *, without: tuple[str, ...] = (), **fields: Any) -> StudyPreset:
    """A CPU preset: the cpu config with :data:`CPU_PROTOCOL` (but the keys in ``without``, e.g. what the study
    searches), then the study's ``overrides``."""
    shared = {k: v for k, v in CPU_PROTOCOL.items() if k not in without}
    return StudyPreset("cpu", {**shared, **overrides}, **fields)
