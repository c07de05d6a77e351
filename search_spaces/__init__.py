"""Search spaces as data: each space maps dotted config keys to a distribution, a grid or a constant.

A space is a dict ``{"loss.temperature": LogUniform(0.05, 1.0), ...}`` of :class:`LogUniform`, :class:`Choice`,
:class:`Grid` (every value is run: a paper sweep) or plain constants; a :class:`Conditional` entry adds
parameters only for some values of another key (σ only when ``loss.name == "dclw"``, α only for EqCo).
:data:`SPACES` names the spaces the studies combine, and ``PAPER_*`` hold the papers' grids.

:func:`keys_of` lists every key a space can produce, and ``tests/study/execution/test_search_spaces.py`` checks
each is a valid config key. The package imports nothing, Ray and Optuna included: the study's execution floor turns a
space into a Ray Tune ``param_space`` or an Optuna define-by-run function
(:mod:`dcl_core.study.execution.space_translation`).
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
]
