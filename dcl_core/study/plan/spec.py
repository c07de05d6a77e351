"""What a study runs: the :class:`StudySpec` (base config, grids, optional search space) and its validation, all
before Ray starts (how one invocation runs it: :mod:`dcl_core.study.plan.run_options`).

A study runs as one or more Tune experiments (:func:`experiments`): one per sub-grid, or, with a search, one
Optuna search per grid point.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from dcl_core.config import (
    CONFIG_KEYS,
    Config,
    ConfigError,
    LossSource,
    apply_overrides,
    check_params_used,
    to_flat_dict,
)
from dcl_core.study.analysis.columns import x_column
from dcl_core.study.analysis.sequential import Design

# Resources and StudyOptions lived here: a study Tune started before they moved unpickles them by this name
from dcl_core.study.plan.run_options import Resources, StudyOptions  # noqa: F401
from search_spaces import Choice, Conditional, Grid, LogUniform, Space, keys_of


class StudyInterruptedError(Exception):
    """The study stopped before every trial finished (Ctrl-C): nothing is summarized; ``--resume`` continues."""


MAX_TRIALS = 100_000  # a grid larger than this is a typo (e.g. --seeds 1000000), refused before validating it
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")


def check_name(name: str) -> None:
    """A study name is a folder and an MLflow experiment: a plain identifier (letters, digits, ``_ . -``, not
    starting with ``.`` or ``-``), so it can never point outside the output folder (``..``, ``/``, ``""``)."""
    if not NAME.fullmatch(name) or ".." in name:
        raise ConfigError(f"study name {name!r} must be 1-100 letters, digits, '_', '.' or '-', start with a letter "
                          "or digit and not contain '..'")


@dataclass(frozen=True)
class StudySpec:
    """What to run.

    Attributes:
        name: study (and MLflow experiment) name.
        base: the configuration every trial starts from.
        grid: keys run exhaustively (``Grid``) or fixed. A sequence of such spaces runs each as its own
            Tune experiment (e.g. SimCLR's and SiMo's K live in different keys). With a search, one Optuna
            search per grid point.
        search: an Optuna space (``None`` = pure grid).
        num_samples: trials per Optuna search.
        x_key / x_label: the swept quantity for tables and plots: a config key (``loss.temperature``) or a
            results-table column (``num_negatives``, the derived K).
        series: results-table columns whose values name one line of the table/plot (``framework`` +
            ``method`` gives e.g. ``simo+eqco(α=256)``).
        gap: add the DCL − InfoNCE row (Table 1 style) to the table and summary.
        questions: what the study answers (:class:`dcl_core.study.analysis.answer.Question`): each gets a headline
            statistic with a calibrated 95% interval and a verdict.
        pairs: ``(better, base)`` series compared cell by cell, paired by seed (``None``: every DCL/InfoNCE pair).
        paper: the key of the paper's numbers in :mod:`dcl_core.study.analysis.paper` (a study's name can be changed
            with ``--name``; its paper cannot).
        design: the sequential design its seeds are added under (``--until-resolved``), which widens every
            verdict's interval so that looking after each round keeps the null rate at 5%; ``None``: one look.
        loss_sources: what each user loss the study runs is made of (:class:`~dcl_core.config.LossSource`: its
            file, and the Python sources of its folder or package with their hashes), set by
            :func:`~dcl_core.study.plan.prepared.prepare` (logged with each trial; a resume must find them
            unchanged). Empty for the built-in losses, and in a re-analysis, which imports no user code.
    """

    name: str
    base: Config
    grid: Space | Sequence[Space]
    x_key: str
    x_label: str
    search: Space | None = None
    num_samples: int = 1
    log_x: bool = False
    gap: bool = False
    title: str = ""
    series: tuple[str, ...] = ("loss",)
    questions: tuple[Any, ...] = ()
    pairs: tuple[tuple[str, str], ...] | None = None
    paper: str | None = None
    description: str = ""  # the MLflow experiment's description (the study's question and paper table)
    design: Design | None = None
    loss_sources: tuple[LossSource, ...] = ()

    @property
    def grids(self) -> list[Space]:
        """The study's grids as a list (one grid, or the several it was given)."""
        return [self.grid] if isinstance(self.grid, Mapping) else list(self.grid)


def with_base(spec: StudySpec, overrides: dict[str, Any]) -> StudySpec:
    """The same study with overrides applied to its base config (validated)."""
    return replace(spec, base=apply_overrides(spec.base, overrides))


def with_asha(spec: StudySpec, asha: bool) -> StudySpec:
    """The study as ``--asha`` runs it: kNN every epoch (ASHA compares trials at intermediate epochs, so each
    needs a fresh accuracy every epoch). ConfigError for ``--asha`` on a grid sweep, whose cells it would cut
    short."""
    if not asha:
        return spec
    if spec.search is None:
        raise ConfigError("--asha stops trials early, which would cut cells of a grid sweep short; use it with "
                          "--search optuna")
    return with_base(spec, {"eval.knn_every": 1})


def question_keys(spec: StudySpec) -> list[str]:
    """The names ``--effect-of-interest`` knows the study's questions by: ``<statistic>_<i>``, as the summary
    run's ``verdict/<statistic>_<i>/…`` metrics name them."""
    return [f"{q.statistic.name}_{i}" for i, q in enumerate(spec.questions)]


def with_effects_of_interest(spec: StudySpec, given: Sequence[str]) -> StudySpec:
    """The study with δ set on the questions ``--effect-of-interest KEY=VALUE`` names: KEY is a question's
    ``<statistic>_<i>`` or its statistic's name (every question of that statistic), VALUE the effect in the
    statistic's own units, signed (e.g. ``std_difference=1.0``: a Δstd of one point of kNN accuracy). ConfigError
    (one line) for a KEY the study does not ask about or a VALUE that is not a finite, non-zero number."""
    if not given:
        return spec
    keys = question_keys(spec)
    deltas: dict[int, float] = {}
    for item in given:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep:
            raise ConfigError(f"--effect-of-interest takes KEY=VALUE, got {item[:80]!r}")
        try:
            value = float(text)
        except ValueError:
            raise ConfigError(f"--effect-of-interest {key}: {text[:40]!r} is not a number") from None
        if not math.isfinite(value) or value == 0:
            raise ConfigError(f"--effect-of-interest {key}: the effect must be a finite, non-zero number, got {text!r}")
        which = [i for i, k in enumerate(keys) if key in (k, k.rsplit("_", 1)[0])]
        if not which:
            known = ", ".join(keys) or "none"
            raise ConfigError(f"--effect-of-interest: {key[:60]!r} is not a question of study {spec.name} "
                              f"(its questions: {known})")
        deltas |= dict.fromkeys(which, value)
    questions = tuple(replace(q, effect_of_interest=deltas[i]) if i in deltas else q
                      for i, q in enumerate(spec.questions))
    return replace(spec, questions=questions)


def grid_points(grid: Space) -> list[dict[str, Any]]:
    """Every combination of the grid's ``Grid`` values (constants included in each)."""
    points: list[dict[str, Any]] = [{}]
    for key, value in grid.items():
        values = value.values if isinstance(value, Grid) else (value,)
        points = [{**p, key: v} for p in points for v in values]
    return points


def num_grid_points(grid: Space) -> int:
    """The number of grid points (trials per seed) of ``grid``: the product of its Grid axes' lengths."""
    return math.prod(len(v.values) for v in grid.values() if isinstance(v, Grid))


def validate_spec(spec: StudySpec) -> None:
    """Apply every grid point, and at each point both ends of every range its search can sample, to the base
    config; ConfigError (one line) if any trial the study could run is invalid."""
    check_name(spec.name)
    trials = sum(map(num_grid_points, spec.grids)) * (spec.num_samples if spec.search else 1)
    if trials > MAX_TRIALS:
        raise ConfigError(f"study {spec.name} would run {trials} trials (more than {MAX_TRIALS}); check --seeds, "
                          "--num-samples and the grid")
    for key in set().union(*map(keys_of, spec.grids)) | (keys_of(spec.search) if spec.search else set()):
        if key not in CONFIG_KEYS:
            raise ConfigError(f"study {spec.name}: unknown config key {key!r} in its space")
    # A seed interacts with no other key: its extremes stand for all of them (a 1000-seed grid stays cheap).
    grids = [{k: Grid((min(v.values), max(v.values))) if k == "seed" and isinstance(v, Grid) else v
              for k, v in grid.items()} for grid in spec.grids]
    points = [apply_overrides(spec.base, point) for grid in grids for point in grid_points(grid)]
    if spec.search:
        for cfg in points:
            _validate_search(cfg, spec.search, sampled=keys_of(spec.search))
    check_params_used(spec.base.loss.params, loss_names(spec))  # only a user loss takes them


def check_set_not_swept(spec: StudySpec, overrides: dict[str, str]) -> None:
    """``--set`` of a key the study itself sets per trial would be silently overridden: refused (an empty
    ``data.root``, which would fall back to the default data, is refused with every empty path by the config)."""
    if "output_dir" in overrides:
        raise ConfigError("--set output_dir: a study gives every trial its own folder; use --output-dir")
    swept = set().union(*map(keys_of, spec.grids)) | (keys_of(spec.search) if spec.search else set())
    clash = sorted(swept & set(overrides))
    if clash:
        raise ConfigError(f"--set {clash[0]}: this study sets {clash[0]} per trial (its grid or search space), "
                          "so a fixed value would be ignored; drop it (or use --losses / --seeds / --search)")


def loss_names(spec: StudySpec) -> set[str]:
    """Every ``loss.name`` a trial of the study can have: its base config's where no grid or search sets it, each
    grid's, and those its search chooses from."""
    values = [grid.get("loss.name", spec.base.loss.name) for grid in spec.grids]
    if spec.search and "loss.name" in spec.search:
        values.append(spec.search["loss.name"])
    return {str(n) for v in values for n in (v.values if isinstance(v, (Grid, Choice)) else (v,))}


def _validate_search(cfg: Config, space: Space, sampled: set[str]) -> None:
    """Every extreme value ``space`` can give a trial starting from ``cfg``. A conditional branch is checked
    where a trial can enter it: its key is fixed to a matching value, or sampled (then for each match)."""
    for key, dist in space.items():
        if isinstance(dist, LogUniform):
            for value in (dist.low, dist.high):
                apply_overrides(cfg, {key: value})
        elif isinstance(dist, Choice | Grid):
            for value in dist.values:
                apply_overrides(cfg, {key: value})
        elif isinstance(dist, Conditional):
            if dist.key in sampled:
                for value in dist.equals:
                    _validate_search(apply_overrides(cfg, {dist.key: value}), dist.params, sampled)
            elif to_flat_dict(cfg)[dist.key] in dist.equals:
                _validate_search(cfg, dist.params, sampled)


def varied_keys(spec: StudySpec) -> tuple[str, ...]:
    """The config keys whose values tell the study's trials apart (they name trials and their folders)."""
    keys = ["loss.name"]
    for grid in spec.grids:
        keys += [k for k, v in grid.items() if isinstance(v, Grid) or k == "framework.name"]
    keys += sorted(keys_of(spec.search)) if spec.search else []
    return tuple(dict.fromkeys(keys))


class TrialTags(Mapping[str, str]):
    """The MLflow tags every trial run carries, tag -> the config key it holds, and which of them place a trial in
    the study (its run's ``cell`` tag and colour, :class:`~dcl_core.study.tracking.MLflowTrialCallback`).

    Attributes:
        cell: the tags naming the trial's cell: each grid key's (the swept quantity first), then ``loss``; the seed
            and searched keys are left out, since a cell's trials differ in them.
        series: the results columns naming the trial's line in the study's plot (:attr:`StudySpec.series`).
    """

    def __init__(self, keys: Mapping[str, str], cell: Sequence[str], series: Sequence[str]) -> None:
        self.config_keys, self.cell, self.series = dict(keys), tuple(cell), tuple(series)

    def __getitem__(self, tag: str) -> str:
        return self.config_keys[tag]

    def __iter__(self) -> Iterator[str]:
        return iter(self.config_keys)

    def __len__(self) -> int:
        return len(self.config_keys)

    def __repr__(self) -> str:
        return f"TrialTags({self.config_keys!r}, cell={self.cell!r}, series={self.series!r})"


def trial_tags(spec: StudySpec) -> TrialTags:
    """The MLflow tags every trial run carries, by name: the config key each holds (``loss``, ``seed``, and each
    varied key by its results column, e.g. ``temperature``). The runs table groups, filters and colours by them
    without 48 params to pick from; the study's saved view groups by the cell they name."""
    keys = {"loss": "loss.name", "seed": "seed"} | {x_column(k): k for k in varied_keys(spec)}
    searched = keys_of(spec.search) if spec.search else set()
    cell = [t for t, key in keys.items() if t not in ("loss", "seed") and key not in searched]
    cell.sort(key=lambda t: t != x_column(spec.x_key))
    return TrialTags(keys, [*cell, "loss"], spec.series)


# Joins a study's name to an experiment's suffix: a character study names cannot contain (NAME), so experiment
# folders are prefix-free. With "-", study "temperature_sweep"'s search folder "temperature_sweep-dcl" was also
# study "temperature_sweep-dcl"'s own folder, and that study's --overwrite deleted it.
EXPERIMENT_SEP = "+"


@dataclass(frozen=True)
class TuneExperiment:
    """One Tune experiment of a study: a sub-grid, the grid point an Optuna search is pinned to (``{}`` for a
    grid experiment, which runs the whole sub-grid), and its name."""

    grid: Space
    point: dict[str, Any]
    name: str


def tune_experiments(spec: StudySpec) -> list[TuneExperiment]:
    """Grid mode: one experiment per sub-grid. Search mode: one Optuna search per grid point. With several
    sub-grids, each name carries the constants that tell its sub-grid apart (e.g. ``simclr`` / ``simo``):
    ``eqco_negatives_sweep+simclr``, ``batch_size_sweep+dcl-16`` (:data:`EXPERIMENT_SEP`), never another study's
    name."""
    grids = spec.grids
    labels = []
    for i, g in enumerate(grids):
        constants = {k: v for k, v in g.items() if not isinstance(v, Grid)}
        distinct = {k: v for k, v in constants.items() if any(o.get(k) != v for o in grids if o is not g)}
        labels.append(distinct or ({"part": i} if len(grids) > 1 else {}))
    out = []
    for g, label in zip(grids, labels, strict=True):
        points = [{}] if spec.search is None else [
            {k: v for k, v in p.items() if isinstance(g.get(k), Grid)} for p in grid_points(g)]
        for point in points:
            suffix = "-".join(str(v) for v in {**label, **point}.values())
            out.append(TuneExperiment(g, point, f"{spec.name}{EXPERIMENT_SEP}{suffix}" if suffix else spec.name))
    names = [e.name for e in out]
    if len(set(names)) != len(names):  # two Tuners in one directory would restore each other's trials
        raise ConfigError(f"study {spec.name}: experiments share a name ({', '.join(names)}); make sub-grids differ")
    return out


# ------------------------------------------------------------------------------------------------ seed rounds
# A grid study's seeds may be run in rounds: the seeds it started with, then the seeds `--seeds N --resume` (or
# `--until-resolved`) adds. A round is its own Tune experiment per sub-grid (a finished Tuner cannot grow its
# grid): the first keeps the sub-grid's name, a later one adds "+s<first>-<last>" (EXPERIMENT_SEP: no study name
# can end so). Rows of every round make one table, so the answer counts every seed.
SEED = "seed"


def grid_seeds(spec: StudySpec) -> tuple[int, ...] | None:
    """The seeds every sub-grid of a grid study runs (its ``seed`` grid), or None: a search, or a study whose
    sub-grids do not all sweep the same seeds, cannot be extended by seed."""
    if spec.search is not None:
        return None
    found = {axis.values if isinstance(axis := g.get(SEED), Grid) else None for g in spec.grids}
    seeds = found.pop() if len(found) == 1 else None
    return tuple(seeds) if seeds else None


def round_experiments(experiments: Sequence[TuneExperiment],
                      rounds: Sequence[Sequence[int]] | None) -> list[TuneExperiment]:
    """The Tune experiments of a grid study run in seed ``rounds`` (None or one round: ``experiments`` as they
    are): every sub-grid once per round, its seed grid that round's seeds, round by round."""
    if not rounds or len(rounds) == 1:
        return list(experiments)
    out = []
    for i, seeds in enumerate(rounds):
        for e in experiments:
            name = e.name if i == 0 else f"{e.name}{EXPERIMENT_SEP}s{seeds[0]}-{seeds[-1]}"
            out.append(TuneExperiment({**e.grid, SEED: Grid(tuple(seeds))}, e.point, name))
    return out


def unseeded(spec: StudySpec) -> str:
    """The grids without their seeds: what an extension by seeds must leave unchanged."""
    return repr([{k: v for k, v in g.items() if k != SEED} for g in spec.grids])
