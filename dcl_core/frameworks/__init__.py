"""Frameworks decide how views, keys and negatives are formed; losses decide how they are scored.

SimCLR is here. MoCo-v2 (momentum key encoder + queue), SiMo (momentum encoder, in-batch negatives) and NNCLR
(nearest-neighbour positives from a support queue) plug in the same way: a module whose ``forward(v1, v2)``
builds :class:`~dcl_core.losses.PairSimilarities` and hands them to any loss's ``from_similarities``, plus an
``after_step()`` hook for momentum/queue updates.
"""

from dcl_core.frameworks.simclr import SimCLR

FRAMEWORKS = {"simclr": SimCLR}

__all__ = ["FRAMEWORKS", "SimCLR"]
