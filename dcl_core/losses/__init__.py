"""Contrastive objectives, one file per loss, all with the signature ``loss(z1, z2) -> LossOutput``.

``LOSSES`` maps the config's ``loss.name`` to the class; its keys are :data:`dcl_core.config.LOSS_NAMES`. A loss
declares itself: its class's ``spec`` (name, colour, own parameters; :mod:`dcl_core.config.loss_registry`) is
all the config, the builder, the colours and the checker need, so adding a loss is adding its file and its test.
"""

import importlib

from dcl_core.config import BUILTIN_LOSSES
from dcl_core.losses.align_uniform import AlignUniformLoss
from dcl_core.losses.base import (
    ContrastiveLoss,
    LossOutput,
    PairSimilarities,
    npc_diagnostics,
    npc_multiplier,
    two_view_similarities,
)
from dcl_core.losses.dcl import DCLLoss
from dcl_core.losses.dclw import DCLWLoss, vmf_weights
from dcl_core.losses.dclw_exp import DCLWExpLoss
from dcl_core.losses.eqco import EqCoLoss, sample_negatives
from dcl_core.losses.infonce import InfoNCELoss


def _builtin_losses() -> dict[str, type[ContrastiveLoss]]:
    """Each loss the registry read from this folder, imported, and its class's ``spec`` checked against what was read
    without importing it (the command lines' and the study driver's torch-free view)."""
    out: dict[str, type[ContrastiveLoss]] = {}
    for entry in BUILTIN_LOSSES:
        cls = getattr(importlib.import_module(entry.module), entry.cls)
        if cls.spec != entry.spec:
            raise ImportError(f"{entry.module}.{entry.cls}.spec differs from the one read from its source: write it "
                              "with literals only (dcl_core.config.loss_registry)")
        out[entry.spec.name] = cls
    return out


# ``loss.name`` -> class, for every built-in loss (in LOSS_NAMES's order): each declares itself in its own file.
LOSSES: dict[str, type[ContrastiveLoss]] = _builtin_losses()

__all__ = [
    "LOSSES",
    "AlignUniformLoss",
    "ContrastiveLoss",
    "DCLLoss",
    "DCLWExpLoss",
    "DCLWLoss",
    "EqCoLoss",
    "InfoNCELoss",
    "LossOutput",
    "PairSimilarities",
    "npc_diagnostics",
    "npc_multiplier",
    "sample_negatives",
    "two_view_similarities",
    "vmf_weights",
]
