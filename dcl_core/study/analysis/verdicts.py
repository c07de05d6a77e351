"""What a question's interval says of the paper's claim: the verdict's words (:class:`VerdictWord`, :func:`verdict`)
and, for an interval that supports the paper, where it lies against the effect of interest δ (:func:`size`).

Each word follows from "the truth lies in the interval" alone (:mod:`.intervals`; at a look of a group-sequential
design, :mod:`.sequential`, also its futility bound), so no multiplicity is added. How a verdict prints is
:mod:`.answer_output`'s and :class:`.answer.Verdict`'s.
"""

from __future__ import annotations

import math
from enum import StrEnum

from dcl_core.study.analysis.intervals import Estimate


class VerdictWord(StrEnum):
    """A verdict's words, as printed in ``table.txt`` and logged as the summary run's ``verdict_<i>`` tags."""

    SUPPORTS = "supports the paper"
    CONTRADICTS = "contradicts the paper"
    RULES_OUT = "rules out the paper's size"
    NOT_RESOLVED = "not resolved"

    @property
    def settled(self) -> bool:
        """Whether the interval answers the question either way (every word but "not resolved")."""
        return self is not VerdictWord.NOT_RESOLVED


class Size(StrEnum):
    """Where a supporting interval lies against the effect of interest δ (both bounds on one side of it)."""

    SMALLER = "smaller than the paper's"
    LARGER = "larger than the paper's"


def verdict(est: Estimate, paper_sign: int, delta: float | None = None) -> VerdictWord:
    """The words the 95% interval says of a claim whose sign the paper gives.

    ``paper_sign`` +1: the paper finds the statistic > 0; −1: < 0. ``delta``: the effect of interest (the paper's
    like-for-like value, or one given; None: none). Each word follows from "the truth lies in the interval" alone,
    so no multiplicity is added:

    - supports the paper: the interval lies strictly on the paper's side of 0;
    - contradicts the paper: strictly on the other side;
    - rules out the paper's size: it contains 0 but lies strictly on 0's side of δ (no effect as large as δ; at a
      :class:`.sequential.GroupSequential` look, its futility bound does);
    - not resolved: it contains 0 and δ (or there is no interval, or no δ)."""
    if paper_sign not in (1, -1):
        raise ValueError(f"paper_sign must be +1 or -1, not {paper_sign!r}")
    if not est.has_interval:
        return VerdictWord.NOT_RESOLVED
    if est.lo > 0 or est.hi < 0:
        return VerdictWord.SUPPORTS if (est.lo > 0) == (paper_sign > 0) else VerdictWord.CONTRADICTS
    if delta is not None and math.isfinite(delta) and delta != 0:
        if est.futility is None:
            ruled_out = excludes(est, delta)
        else:  # a group-sequential look: its futility bound on δ's side
            flo, fhi = est.futility
            ruled_out = fhi < delta if delta > 0 else flo > delta
        if ruled_out:
            return VerdictWord.RULES_OUT
    return VerdictWord.NOT_RESOLVED


def excludes(est: Estimate, value: float) -> bool:
    """Whether the interval lies strictly on one side of ``value`` (False without an interval)."""
    return est.has_interval and (est.lo > value or est.hi < value)


def size(est: Estimate, paper_sign: int, delta: float | None) -> Size | None:
    """For an interval that supports the paper: whether it also excludes δ, below it (an effect, smaller than the
    paper's) or beyond it (larger); None otherwise, or without a δ on the paper's side of 0."""
    if (delta is None or not math.isfinite(delta) or delta * paper_sign <= 0
            or verdict(est, paper_sign) is not VerdictWord.SUPPORTS or not excludes(est, delta)):
        return None
    beyond = est.lo > delta if delta > 0 else est.hi < delta
    return Size.LARGER if beyond else Size.SMALLER
