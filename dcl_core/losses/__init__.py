"""Contrastive objectives, one file per loss, all with the signature ``loss(z1, z2) -> LossOutput``.

``LOSSES`` maps the config's ``loss.name`` to the class.
"""

from dcl_core.losses.align_uniform import AlignUniformLoss
from dcl_core.losses.base import (
    ContrastiveLoss,
    LossOutput,
    PairSimilarities,
    gather_with_grad,
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
    "gather_with_grad",
    "npc_diagnostics",
    "npc_multiplier",
    "sample_negatives",
    "two_view_similarities",
    "vmf_weights",
]
