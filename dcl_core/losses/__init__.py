"""Contrastive objectives, one file per loss, all with the signature ``loss(z1, z2) -> LossOutput``.

``LOSSES`` maps the config's ``loss.name`` to the class; its keys are :data:`dcl_core.config.LOSS_NAMES`.
"""

from dcl_core.config import LOSS_NAMES
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

LOSSES: dict[str, type[ContrastiveLoss]] = {
    "infonce": InfoNCELoss,
    "dcl": DCLLoss,
    "dclw": DCLWLoss,
    "dclw_exp": DCLWExpLoss,
    "eqco": EqCoLoss,
    "align_uniform": AlignUniformLoss,
}
# The names live in dcl_core.config, which every CLI and the study driver import before any torch: importing
# this registry there would cost them torch's import (seconds) for --help and for rejecting bad input. So the
# config's tuple is the one list, and the registry is checked against it when it is imported.
if tuple(LOSSES) != LOSS_NAMES:
    raise ImportError(f"LOSSES {tuple(LOSSES)} must match dcl_core.config.LOSS_NAMES {LOSS_NAMES}")

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
