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

import importlib
from typing import Any

from dcl_core.frameworks.negatives import NEGATIVES, Negatives

# The framework classes need torch; the config imports this package's torch-free declarations
# (dcl_core.frameworks.negatives) before torch loads, so the classes and FRAMEWORKS load on first use.
_CLASSES = {"SimCLR": "simclr", "MoCo": "moco", "SiMo": "simo", "NNCLR": "nnclr"}


def __getattr__(name: str) -> Any:
    if name in _CLASSES:
        return getattr(importlib.import_module(f"dcl_core.frameworks.{_CLASSES[name]}"), name)
    if name == "FRAMEWORKS":
        from dcl_core.config.schema import FRAMEWORK_NAMES  # on first use, with the torch classes

        frameworks = {fw: __getattr__(cls) for cls, fw in _CLASSES.items()}
        # The names live in the torch-free dcl_core.config (the CLIs check them without importing torch); the
        # registry and the negatives' declarations are checked against that one list.
        if tuple(frameworks) != FRAMEWORK_NAMES or tuple(NEGATIVES) != FRAMEWORK_NAMES:
            raise ImportError(f"FRAMEWORKS {tuple(frameworks)} and NEGATIVES {tuple(NEGATIVES)} must match "
                              f"dcl_core.config.FRAMEWORK_NAMES {FRAMEWORK_NAMES}")
        globals()["FRAMEWORKS"] = frameworks
        return frameworks
    raise AttributeError(f"module 'dcl_core.frameworks' has no attribute {name!r}")


__all__ = ["FRAMEWORKS", "NEGATIVES", "NNCLR", "MoCo", "Negatives", "SiMo", "SimCLR"]
