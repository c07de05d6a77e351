"""The distributions, the paper's grids, and their translation to Ray Tune and Optuna."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Union

# DCL Table 18 / A.9: tau in {0.07, 0.1, 0.2, ..., 1.0}, kNN, batch 512, 500 epochs.
PAPER_TAU_GRID: tuple[float, ...] = (0.07, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
# DCL Table 1: batch sizes 32..512.
PAPER_BATCH_SIZES: tuple[int, ...] = (32, 64, 128, 256, 512)
# DCL Table 5: MoCo-v2 queue sizes (ImageNet-100 columns; ImageNet-1K uses 64, 256, 65536).
PAPER_QUEUE_SIZES: tuple[int, ...] = (32, 64, 128, 256, 8192)
# EqCo Fig. 3 (SimCLR, alpha = 256) / Fig. 4 (SiMo, alpha = 256): negatives per query.
PAPER_EQCO_KS: tuple[int, ...] = (16, 32, 64, 128, 256)
# DCL Eq. 7 / Table 2: sigma = 0.5; a very large sigma is DCL (w -> 1).
PAPER_SIGMA_GRID: tuple[float, ...] = (0.1, 0.25, 0.5, 1.0, 2.0, 1000.0)


@dataclass(frozen=True)
class LogUniform:
    """A float sampled log-uniformly between ``low`` and ``high``."""

    low: float
    high: float


@dataclass(frozen=True)
class Choice:
    """One of ``values``, sampled."""

    values: tuple[Any, ...]


@dataclass(frozen=True)
class Grid:
    """Every value is run (an exact paper sweep), not sampled."""

    values: tuple[Any, ...]


@dataclass(frozen=True)
class Conditional:
    """Parameters that exist only when ``key`` takes one of ``equals``."""

    key: str
    equals: tuple[Any, ...]
    params: Mapping[str, Any] = field(default_factory=dict)


Distribution = Union[LogUniform, Choice, Grid]  # noqa: UP007 - runtime alias
Space = Mapping[str, Union[Distribution, Conditional, Any]]  # noqa: UP007

TAU: Space = {"loss.temperature": LogUniform(0.05, 1.0)}
LR: Space = {"optim.base_lr": LogUniform(0.003, 0.3)}
SIGMA: Space = {"dclw.sigma": Conditional("loss.name", ("dclw",), {"loss.sigma": LogUniform(0.1, 4.0)})}
ALPHA: Space = {"eqco.alpha": Conditional("loss.name", ("eqco",), {"loss.alpha": LogUniform(16.0, 65536.0)})}

SPACES: dict[str, Space] = {
    "tau": TAU,
    "tau_grid": {"loss.temperature": Grid(PAPER_TAU_GRID)},
    "lr": LR,
    "sigma": SIGMA,
    "alpha": ALPHA,
    "batch_grid": {"optim.batch_size": Grid(PAPER_BATCH_SIZES)},
    "queue_grid": {"framework.queue_size": Grid(PAPER_QUEUE_SIZES)},
    "sigma_grid": {"loss.sigma": Grid(PAPER_SIGMA_GRID)},
}


def keys_of(space: Space) -> set[str]:
    """Every config key the space can produce (including conditional ones)."""
    keys: set[str] = set()
    for key, dist in space.items():
        if isinstance(dist, Conditional):
            keys |= keys_of(dist.params)
        else:
            keys.add(key)
    return keys


def to_tune(space: Space) -> dict[str, Any]:
    """A Ray Tune ``param_space`` fragment: Grid -> grid_search, others -> tune domains; constants pass.

    Conditional entries need define-by-run and are rejected here (use :func:`to_optuna`).
    """
    # Imported here: ray.tune takes seconds to import, and the study driver and the CLIs import this module to
    # check a study before Ray starts.
    from ray import tune

    out: dict[str, Any] = {}
    for key, dist in space.items():
        if isinstance(dist, Grid):
            out[key] = tune.grid_search(list(dist.values))
        elif isinstance(dist, LogUniform):
            out[key] = tune.loguniform(dist.low, dist.high)
        elif isinstance(dist, Choice):
            out[key] = tune.choice(list(dist.values))
        elif isinstance(dist, Conditional):
            raise ValueError(f"{key}: conditional parameters need an Optuna search (--search optuna)")
        else:
            out[key] = dist
    return out


class OptunaSpace:
    """An Optuna define-by-run function for ``OptunaSearch(space=...)`` (a picklable callable: Tune saves the
    searcher with the experiment so a study can resume).

    ``constants`` are fixed keys (e.g. the loss of this study); they decide conditional branches and are
    returned so every trial's config is complete.
    """

    def __init__(self, space: Space, constants: Mapping[str, Any] | None = None) -> None:
        self.space = dict(space)
        self.constants = dict(constants or {})

    def __call__(self, trial: Any) -> dict[str, Any]:
        """Sample the space for one Optuna trial; the constants plus the chosen values."""
        fixed = dict(self.constants)
        chosen: dict[str, Any] = {}

        def visit(sub: Space) -> None:
            for key, dist in sub.items():
                if isinstance(dist, Conditional):
                    if {**fixed, **chosen}.get(dist.key) in dist.equals:
                        visit(dist.params)
                elif isinstance(dist, LogUniform):
                    chosen[key] = trial.suggest_float(key, dist.low, dist.high, log=True)
                elif isinstance(dist, Choice | Grid):
                    chosen[key] = trial.suggest_categorical(key, list(dist.values))
                else:
                    fixed[key] = dist

        visit(self.space)
        return fixed


def to_optuna(space: Space, constants: Mapping[str, Any] | None = None) -> Callable[[Any], dict[str, Any]]:
    """The define-by-run function of ``space`` (see :class:`OptunaSpace`)."""
    return OptunaSpace(space, constants)


def optuna_distributions(space: Space) -> dict[str, Any]:
    """Optuna distributions of every sampled key (conditional ones included), e.g. to rebuild a study."""
    # Imported here, like Ray in to_tune: Optuna takes most of a second to import, and only Optuna searches need it.
    from optuna.distributions import CategoricalDistribution, FloatDistribution

    out: dict[str, Any] = {}
    for key, dist in space.items():
        if isinstance(dist, Conditional):
            out |= optuna_distributions(dist.params)
        elif isinstance(dist, LogUniform):
            out[key] = FloatDistribution(dist.low, dist.high, log=True)
        elif isinstance(dist, Choice | Grid):
            out[key] = CategoricalDistribution(list(dist.values))
    return out
