"""A search space (:mod:`search_spaces`: data) as Ray Tune and Optuna take it: a Tune ``param_space``
(:func:`to_tune`), an Optuna define-by-run function (:func:`to_optuna`) and Optuna's distributions
(:func:`optuna_distributions`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from optuna.distributions import CategoricalDistribution, FloatDistribution
from ray import tune

from search_spaces import Choice, Conditional, Grid, LogUniform, Space


def to_tune(space: Space) -> dict[str, Any]:
    """A Ray Tune ``param_space`` fragment: Grid -> grid_search, others -> tune domains; constants pass.

    Conditional entries need define-by-run and are rejected here (use :func:`to_optuna`).
    """
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
    out: dict[str, Any] = {}
    for key, dist in space.items():
        if isinstance(dist, Conditional):
            out |= optuna_distributions(dist.params)
        elif isinstance(dist, LogUniform):
            out[key] = FloatDistribution(dist.low, dist.high, log=True)
        elif isinstance(dist, Choice | Grid):
            out[key] = CategoricalDistribution(list(dist.values))
    return out
