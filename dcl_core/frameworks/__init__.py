"""Frameworks decide how views, keys and negatives are formed; losses decide how they are scored.

A framework is a module whose ``forward(view1, view2)`` encodes the views and hands the loss what to score:
``loss(z1, z2)`` for SimCLR (the loss forms the two-view similarities itself), and for the others a
:class:`~dcl_core.losses.PairSimilarities` of their own (one positive and a row of negatives per anchor) through
``loss.from_similarities(sims)``. So any framework combines with any pair-similarity loss (InfoNCE, DCL, DCLW,
DCLW-exp, EqCo). ``after_step()`` runs after every optimizer step (momentum update,
queue update).

Conventions the trainer relies on: the trained encoder is the attribute ``model`` (evaluated by the kNN monitor
and saved as the checkpoint's ``model``); everything else in the framework's ``state_dict()`` (momentum
encoder, queues, their pointers) is the framework's own state, saved as the checkpoint's ``framework`` and
restored on resume. The building blocks the momentum frameworks share are in :mod:`dcl_core.frameworks.common`.

| name | paper | positive | negatives |
| --- | --- | --- | --- |
| ``simclr`` | Chen et al. 2020 | other view | the 2N − 2 other views in the batch |
| ``moco`` | MoCo-v2 (Chen et al. 2020) | momentum key of the other view | a FIFO queue of K momentum keys |
| ``simo`` | EqCo Sec. 3 | momentum key of the other view | K of the other N − 1 images' momentum keys |
| ``nnclr`` | Dwibedi et al. 2021 | other view, anchored at NN(z) in a support queue | the other N − 1 images |
"""

from __future__ import annotations

from dcl_core.config import FRAMEWORK_NAMES, NEGATIVES
from dcl_core.frameworks.common import Framework
from dcl_core.frameworks.moco import MoCo
from dcl_core.frameworks.nnclr import NNCLR
from dcl_core.frameworks.simclr import SimCLR
from dcl_core.frameworks.simo import SiMo

FRAMEWORKS: dict[str, type[Framework]] = {"simclr": SimCLR, "moco": MoCo, "simo": SiMo, "nnclr": NNCLR}
# The names live in the torch-free dcl_core.config (the CLIs check them without importing torch), with the table of
# each framework's negatives the config derives K from: the registry and that table are checked against the one list.
if tuple(FRAMEWORKS) != FRAMEWORK_NAMES or tuple(NEGATIVES) != FRAMEWORK_NAMES:
    raise ImportError(f"FRAMEWORKS {tuple(FRAMEWORKS)} and NEGATIVES {tuple(NEGATIVES)} must match "
                      f"dcl_core.config.FRAMEWORK_NAMES {FRAMEWORK_NAMES}")

__all__ = ["FRAMEWORKS", "NNCLR", "MoCo", "SiMo", "SimCLR"]
