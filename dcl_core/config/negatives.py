"""Each framework's negatives as the config sees them: how many negatives a framework offers an anchor for a batch
of N images, and which config key chooses K among them (0 = all offered). The config derives K
(:func:`~dcl_core.config.derive.derive`) and checks it against the batch (:mod:`.validation`) from this table
before torch loads; :mod:`dcl_core.frameworks` holds its registry to the same names, and each framework's module
forms the negatives this table counts.

| framework | K chosen by | negatives offered per anchor |
| --- | --- | --- |
| simclr | ``loss.num_negatives`` (EqCo's sampling) | the 2N − 2 other views |
| moco | ``framework.queue_size`` | the queue: every query is scored against all of it |
| simo | ``framework.num_negatives`` | the N − 1 other images' momentum keys |
| nnclr | ``loss.num_negatives`` | the N − 1 other images (the other view only) |
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType


@dataclass(frozen=True)
class Negatives:
    """One framework's negatives.

    Attributes:
        k_key: the config key whose value is K (0: every negative offered).
        offered: negatives per anchor for a batch of N images and a queue of Q keys, ``offered(N, Q)``.
        formula: ``offered`` in symbols, for messages (``2N-2``).
        what: what the negatives are, in words.
    """

    k_key: str
    offered: Callable[[int, int], int]
    formula: str
    what: str


NEGATIVES: Mapping[str, Negatives] = MappingProxyType({
    "simclr": Negatives("loss.num_negatives", lambda n, q: 2 * n - 2, "2N-2", "the other views in the batch"),
    "moco": Negatives("framework.queue_size", lambda n, q: q, "Q", "the queue"),
    "simo": Negatives("framework.num_negatives", lambda n, q: n - 1, "N-1", "the other images' momentum keys"),
    "nnclr": Negatives("loss.num_negatives", lambda n, q: n - 1, "N-1", "the other images (the other view only)"),
})
