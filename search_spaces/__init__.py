"""Search spaces as data: each space maps dotted config keys to a distribution, a grid or a constant.

A space is a dict ``{"loss.temperature": LogUniform(0.05, 1.0), ...}`` of :class:`LogUniform`, :class:`Choice`,
:class:`Grid` (every value is run: a paper sweep) or plain constants; a :class:`Conditional` entry adds
parameters only for some values of another key (σ only when ``loss.name == "dclw"``, α only for EqCo).
:data:`SPACES` names the spaces the studies combine, and ``PAPER_*`` hold the papers' grids.

The same data becomes a Ray Tune ``param_space`` (:func:`to_tune`: grid_search and Tune domains; conditional
entries are rejected), an Optuna define-by-run function (:func:`to_optuna`, picklable so a Tune study can resume)
or Optuna distributions (:func:`optuna_distributions`). :func:`keys_of` lists every key a space can produce, and
``tests/study/test_search_spaces.py`` checks each is a valid config key. Ray and Optuna are imported only by the
functions that need them, so the study driver can build and check a study without loading either.
"""

from search_spaces.spaces import (
    ALPHA,
    LR,
    PAPER_BATCH_SIZES,
    PAPER_EQCO_KS,
    PAPER_QUEUE_SIZES,
    PAPER_SIGMA_GRID,
    PAPER_TAU_GRID,
    SIGMA,
    SPACES,
    TAU,
    Choice,
    Conditional,
    Grid,
    LogUniform,
    Space,
    keys_of,
    optuna_distributions,
    to_optuna,
    to_tune,
)

__all__ = [
    "ALPHA",
    "LR",
    "PAPER_BATCH_SIZES",
    "PAPER_EQCO_KS",
    "PAPER_QUEUE_SIZES",
    "PAPER_SIGMA_GRID",
    "PAPER_TAU_GRID",
    "SIGMA",
    "SPACES",
    "TAU",
    "Choice",
    "Conditional",
    "Grid",
    "LogUniform",
    "Space",
    "keys_of",
    "optuna_distributions",
    "to_optuna",
    "to_tune",
]
