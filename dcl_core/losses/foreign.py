"""A loss written for another library (lightly's ``DCLLoss`` or ``NTXentLoss``, a solo-learn-style module): an
``nn.Module`` whose constructor takes ``temperature`` and whose ``forward(z1, z2)`` returns a 0-d tensor, adapted to
this project's contract so that it runs wherever a user loss does (``--loss lightly.loss:DCLLoss``, a study's
``--losses``, the checker, DDP).

The adapter (:func:`adapt`) builds the module with ``temperature``, the user's ``loss.params`` and, if its
constructor takes it, ``gather_distributed`` (lightly's losses do: they then gather every rank's embeddings, as this
project's losses do). A module that does not take ``gather_distributed`` cannot see the other ranks' negatives, so
it is refused under DDP with more than one process. It is called on SimCLR's two views as given (its own
normalisation), in fp32 even under autocast (fp64 stays fp64), as this project's similarities are.

What such a loss cannot report: it hands back a bare scalar, so no q_B (DCL Eq. 4), no positive and negative
similarity means and no per-anchor NPC values reach the trainer's metrics; and it has no ``from_similarities``, so
MoCo, NNCLR and SiMo cannot use it (SimCLR only, as Wang & Isola's loss).
"""

from __future__ import annotations

import inspect
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from dcl_core.distributed import distributed_world
from dcl_core.losses.base import ContrastiveLoss, LossOutput, at_least_fp32


def is_foreign(cls: object) -> bool:
    """Whether ``cls`` is another library's loss this adapter takes: an ``nn.Module`` class, not a
    :class:`ContrastiveLoss`, whose constructor takes ``temperature``."""
    if not (inspect.isclass(cls) and issubclass(cls, nn.Module)) or issubclass(cls, ContrastiveLoss):
        return False
    try:
        return "temperature" in inspect.signature(cls).parameters
    except (TypeError, ValueError):  # a constructor without a signature Python can read
        return False


class ForeignLoss(ContrastiveLoss):
    """This project's contract around ``module``, an instance of another library's loss class (:func:`adapt`).

    Args:
        temperature: τ, passed to the module's constructor.
        gather_distributed: passed to the module's constructor if it takes it; otherwise it must be False, or the
            process alone (no DDP).
        **params: the module's other keyword arguments (``loss.params``).
    """

    wrapped: ClassVar[type[nn.Module]]  # set by adapt()

    def __init__(self, temperature: float = 0.1, gather_distributed: bool = False, **params: Any) -> None:
        super().__init__(temperature, gather_distributed)
        if takes_gather(self.wrapped):
            params["gather_distributed"] = gather_distributed
        elif gather_distributed and distributed_world()[1] > 1:
            raise ValueError(f"{self.wrapped.__name__} does not take gather_distributed: under DDP it would contrast "
                             "each process's samples only")
        self.module = self.wrapped(temperature=temperature, **params)

    def forward(self, z1: Tensor, z2: Tensor) -> LossOutput:
        """The module's loss of the two views, computed in fp32 (or fp64), without diagnostics."""
        if z1.shape != z2.shape or z1.dim() != 2:
            raise ValueError(f"z1 and z2 must both be (N, D); got {tuple(z1.shape)} and {tuple(z2.shape)}")
        with torch.autocast(device_type=z1.device.type, enabled=False):
            value = self.module(at_least_fp32(z1), at_least_fp32(z2))
        if not (isinstance(value, Tensor) and value.dim() == 0 and value.is_floating_point()):
            raise TypeError(f"{self.wrapped.__name__}.forward returned {type(value).__name__}"
                            f"{tuple(value.shape) if isinstance(value, Tensor) else ''}, not a 0-d float tensor")
        return LossOutput(loss=value)


def takes_gather(cls: type[nn.Module]) -> bool:
    """Whether the class's constructor takes ``gather_distributed``."""
    return "gather_distributed" in inspect.signature(cls).parameters


def adapt(cls: type[nn.Module]) -> type[ForeignLoss]:
    """A :class:`ForeignLoss` subclass around ``cls``, named after it."""
    return type(cls.__name__, (ForeignLoss,), {"wrapped": cls, "__module__": ForeignLoss.__module__,
                                               "__doc__": f"{cls.__module__}.{cls.__qualname__}, adapted."})
