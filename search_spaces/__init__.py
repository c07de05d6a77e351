"""Search spaces as data: each space maps dotted config keys to a distribution.

A space is a dict ``{"loss.temperature": LogUniform(0.05, 1.0), ...}``; a :class:`Conditional` entry adds
parameters only for some values of another key (σ only when ``loss.name == "dclw"``, α only for EqCo). The
same data becomes a Ray Tune grid (:func:`to_tune`) or an Optuna define-by-run function (:func:`to_optuna`), and
``tests/test_search_spaces.py`` proves every key a space can produce is a valid config key.
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
