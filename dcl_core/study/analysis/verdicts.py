"""What a question's interval says of the paper's claim: the verdict's words (:class:`VerdictWord`, :func:`verdict`)
and, for an interval that supports the paper, where it lies against the effect of interest δ (:func:`size`).

Each word follows from "the truth lies in the interval" alone (:mod:`.intervals`; at a look of a group-sequential
design, :mod:`.sequential`, also its futility bound), so no multiplicity is added. How a verdict prints is
:mod:`.answer_output`'s and :class:`.answer.Verdict`'s. A paper's δ is computed from its table's rounded cells, so it
is known only to within a spread (:meth:`.answer.Question.paper`): "rules out" and the size words then need the
interval beyond every value that spread allows.
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


def verdict(est: Estimate, paper_sign: int, delta: float | None = None, spread: float = 0.0) -> VerdictWord:
    """The words the 95% interval says of a claim whose sign the paper gives.

    ``paper_sign`` +1: the paper finds the statistic > 0; −1: < 0. ``delta``: the effect of interest (the paper's
    like-for-like value, or one given; None: none), known to within ±``spread`` (a paper's value computed from its
    rounded table; 0: exact). Each word follows from "the truth lies in the interval" alone, so no multiplicity is
    added:

    - supports the paper: the interval lies strictly on the paper's side of 0;
    - contradicts the paper: strictly on the other side;
    - rules out the paper's size: it contains 0 but lies strictly on 0's side of every value within ±spread of δ
      (no effect as large as any δ the paper's table allows; at a :class:`.sequential.GroupSequential` look, its
      futility bound does);
    - not resolved: otherwise (or there is no interval, or no δ, or the table allows an effect of 0)."""
    if paper_sign not in (1, -1):
        raise ValueError(f"paper_sign must be +1 or -1, not {paper_sign!r}")
    if not est.has_interval:
        return VerdictWord.NOT_RESOLVED
    if est.lo > 0 or est.hi < 0:
        return VerdictWord.SUPPORTS if (est.lo > 0) == (paper_sign > 0) else VerdictWord.CONTRADICTS
    near = nearest(delta, spread)
    if near is not None:
        if est.futility is None:
            ruled_out = excludes(est, near)
        else:  # a group-sequential look: its futility bound on δ's side
            flo, fhi = est.futility
            ruled_out = fhi < near if near > 0 else flo > near
        if ruled_out:
            return VerdictWord.RULES_OUT
    return VerdictWord.NOT_RESOLVED


def nearest(delta: float | None, spread: float = 0.0) -> float | None:
    """The value within ±``spread`` of δ nearest 0, where all of them lie on δ's side of 0; None without a δ, or
    when the range reaches 0 (no size of effect is then ruled out by excluding it)."""
    if delta is None or not math.isfinite(delta) or delta == 0 or not math.isfinite(spread) or spread < 0:
        return None
    near = delta - math.copysign(spread, delta)
    return near if near * delta > 0 else None


def excludes(est: Estimate, value: float) -> bool:
    """Whether the interval lies strictly on one side of ``value`` (False without an interval)."""
    return est.has_interval and (est.lo > value or est.hi < value)


def size(est: Estimate, paper_sign: int, delta: float | None, spread: float = 0.0) -> Size | None:
    """For an interval that supports the paper: whether it also lies below every value within ±``spread`` of δ
    (an effect, smaller than the paper's) or beyond them all (larger); None otherwise, or without a δ on the
    paper's side of 0."""
    if (delta is None or not math.isfinite(delta) or delta * paper_sign <= 0
            or verdict(est, paper_sign) is not VerdictWord.SUPPORTS):
        return None
    near, far = nearest(delta, spread), delta + math.copysign(spread, delta)
    if near is not None and (est.hi < near if delta > 0 else est.lo > near):
        return Size.SMALLER
    if est.lo > far if delta > 0 else est.hi < far:
        return Size.LARGER
    return None
