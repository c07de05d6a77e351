"""User losses (docs/own-loss.md) that fail inside a study's trial only, each its own way
(tests/study/execution/test_trial_failures.py): they pass the study's pre-flight check, which calls a loss once on a
batch of 8 pairs before Ray starts, and fail on the trial's larger batches (the smoke preset's 32 pairs)."""

from __future__ import annotations

import ctypes
import os
import sys

from dcl_core.losses import ContrastiveLoss, LossOutput, PairSimilarities

CHECK_ANCHORS = 16  # the pre-flight check's batch: 8 pairs, 16 anchors


class _FailsInTrials(ContrastiveLoss):
    """InfoNCE on the pre-flight check's batch; :meth:`fail` on any larger one."""

    def from_similarities(self, sims: PairSimilarities) -> LossOutput:
        if sims.pos.shape[0] > CHECK_ANCHORS:
            self.fail()
        pos = sims.pos / self.temperature
        log_u = sims.negative_logsumexp(self.temperature)
        return LossOutput.with_npc((log_u - pos).mean(), sims, pos, log_u)

    def fail(self) -> None:
        raise NotImplementedError


class Segfaults(_FailsInTrials):
    """A segmentation fault, as a native library's bug gives one."""

    def fail(self) -> None:
        ctypes.string_at(0)


class ExitsHard(_FailsInTrials):
    """``os._exit(1)``: the process ends at once, no Python error."""

    def fail(self) -> None:
        os._exit(1)


class Raises(_FailsInTrials):
    """An ordinary error."""

    def fail(self) -> None:
        raise ValueError("planted failure in the loss")


class SysExits(_FailsInTrials):
    """``sys.exit(3)``."""

    def fail(self) -> None:
        sys.exit(3)
