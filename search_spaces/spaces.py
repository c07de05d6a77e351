"""The distributions and the paper's grids; :func:`keys_of` lists the config keys a space can produce."""

from __future__ import annotations

from collections.abc import Mapping
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
