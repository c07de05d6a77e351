"""A question of the user's own (``--compare``, ``--statistic``, ``--at``, ``--claim``), put to any study.

A study script declares the paper's questions (``Question("DCL flatter across τ than InfoNCE", STD_DIFFERENCE,
"dcl", "infonce")``). :func:`with_own_question` replaces them, before anything runs, with the claim a researcher
states on the command line:

- ``--compare A,B``: the study's own statistics asked of series A against B (A the one claimed better: higher,
  flatter, or with a gain that grows or shrinks as the paper's did), e.g. the batch study's gap at the smallest
  batch for ``my_losses.py:MyLoss,dcl``;
- ``--statistic NAME`` (one of :data:`OWN_STATISTICS`) and ``--at X`` (the x of ``gap_at``): one statistic instead;
- ``--claim TEXT``: the claim's words (default: made from the statistic and the pair, :func:`claim_text`).

Such a question is :attr:`~dcl_core.study.analysis.answer.Question.own`: its verdict says "supports the claim",
"contradicts the claim", "rules out an effect of δ" (δ from ``--effect-of-interest``) or "not resolved", with no
paper value beside it. The options are recorded with the study, so ``answer`` re-asks the same question.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from dcl_core.config import ConfigError, loss_label, loss_reference, to_flat_dict
from dcl_core.study.analysis.answer import Question
from dcl_core.study.analysis.columns import fmt_x
from dcl_core.study.analysis.measures import STATISTICS
from dcl_core.study.analysis.rows import series_label, trial_row
from dcl_core.study.plan.spec import StudySpec, grid_points

# The statistics a claim of one's own can use (best_margin compares a series with itself at a baseline x: the
# DCLW study's own question).
OWN_STATISTICS = ("std_difference", "gap_at", "gap_at_smallest", "gap_slope", "best_gap")
LABELS = {"std_difference": "Δstd", "gap_at": "gap", "gap_at_smallest": "gap", "gap_slope": "gap slope per doubling",
          "best_gap": "best gap", "best_margin": "best margin"}
MAX_CLAIM = 200  # characters of --claim


def claim_text(statistic: str, better: str, base: str, x_label: str, at_x: Any = None, sign: int = 1) -> str:
    """The claim a statistic of ``better`` against ``base`` makes when positive (``sign`` +1) or negative (−1):
    ``PositiveWeighted flatter across tau than dcl``."""
    if statistic == "std_difference":
        return f"{better} flatter across {x_label} than {base}" if sign > 0 else \
            f"{better} less flat across {x_label} than {base}"
    if statistic == "gap_slope":
        return f"{better}'s gain over {base} {'grows' if sign > 0 else 'shrinks'} as {x_label} grows"
    verb = "beats" if sign > 0 else "trails"
    if statistic == "gap_at":
        return f"{better} {verb} {base} at {x_label} {fmt_x(at_x)}"
    if statistic == "gap_at_smallest":
        return f"{better} {verb} {base} at the smallest {x_label}"
    if statistic == "best_margin":
        return f"{better} at its best {x_label} {verb} itself at {x_label} {fmt_x(at_x)}"
    return f"tuned {better} {verb} tuned {base}"


def series_names(spec: StudySpec) -> list[str]:
    """The series the study's trials will be shown under (its results' ``series`` column), in grid order."""
    base = to_flat_dict(spec.base)
    names: list[str] = []
    for grid in spec.grids:
        for point in grid_points(grid):
            names.append(series_label(trial_row({**base, **point}, {}), spec.series))
    return list(dict.fromkeys(names))


def x_values(spec: StudySpec) -> list[Any]:
    """The x values the study's grids run (none for a searched x)."""
    return sorted({p[spec.x_key] for grid in spec.grids for p in grid_points(grid) if spec.x_key in p},
                  key=lambda x: (isinstance(x, str), x))


def _series(name: str, known: Sequence[str]) -> str:
    """``name`` as the study shows it (a loss reference's class name), checked against the study's series."""
    name = name.strip()
    try:
        shown = loss_label(name) if loss_reference(name) is not None else name
    except ConfigError:
        shown = name
    if shown not in known:
        raise ConfigError(f"--compare: {name[:80]!r} is not a series of this study (its series: "
                          f"{', '.join(known)}; add a loss with --losses)")
    return shown


def _pair(compare: str, known: Sequence[str]) -> tuple[str, str]:
    parts = compare.split(",")
    if len(parts) != 2 or not all(p.strip() for p in parts):
        raise ConfigError(f"--compare takes two series, BETTER,BASE (e.g. my_losses.py:MyLoss,dcl), got "
                          f"{compare[:80]!r}")
    better, base = (_series(p, known) for p in parts)
    if better == base:
        raise ConfigError(f"--compare: {better} against itself asks nothing; name two series")
    return better, base


def _at(text: str, xs: Sequence[Any], x_label: str) -> Any:
    """The study's x that ``--at`` names (``0.5`` matches 0.5; ``32`` matches 32)."""
    for x in xs:
        if text.strip() == fmt_x(x):
            return x
        try:
            if isinstance(x, int | float) and math.isclose(float(text), float(x), rel_tol=1e-9):
                return x
        except ValueError:
            pass
    runs = ", ".join(fmt_x(x) for x in xs) or "none: its x is searched"
    raise ConfigError(f"--at {text[:40]!r} is not a {x_label} this study runs (it runs {runs})")


def check_claim(claim: str) -> str:
    """``--claim`` as printed: one line of at most :data:`MAX_CLAIM` printable characters."""
    text = " ".join(claim.split())
    if not text or len(text) > MAX_CLAIM or not text.isprintable():
        raise ConfigError(f"--claim must be one line of 1 to {MAX_CLAIM} printable characters")
    return text


def with_own_question(spec: StudySpec, compare: str | None = None, statistic: str | None = None,
                      at: str | None = None, claim: str | None = None) -> StudySpec:
    """The study asking the user's question instead of the paper's (the study as it is when none is given);
    ConfigError (one line) for a series the study does not have, an unknown statistic, an ``--at`` that is not
    one of its x or a ``--claim`` that would name several questions."""
    if compare is None and statistic is None and at is None and claim is None:
        return spec
    known = series_names(spec)
    if compare is not None:
        better, base = _pair(compare, known)
    elif spec.questions:
        better, base = spec.questions[0].better, spec.questions[0].base
    elif len(known) >= 2:
        better, base = known[0], known[1]
    else:
        raise ConfigError(f"--statistic needs two series to compare; this study has {', '.join(known) or 'none'}")
    if statistic is not None and statistic not in OWN_STATISTICS:
        raise ConfigError(f"--statistic must be one of {', '.join(OWN_STATISTICS)}, got {statistic[:40]!r}")
    if statistic is not None:
        asked: list[Question] = [Question("", STATISTICS[statistic], better, base)]
    elif spec.questions:
        asked = list(spec.questions)
    else:
        raise ConfigError(f"study {spec.name} asks no question of its own: give --statistic "
                          f"({', '.join(OWN_STATISTICS)})")
    xs = x_values(spec)
    at_x = _at(at, xs, spec.x_label) if at is not None else None
    if at is not None and not any(q.statistic.name in ("gap_at", "best_margin") for q in asked):
        raise ConfigError("--at is the x of --statistic gap_at; the study's statistic takes none")
    if claim is not None and len(asked) > 1:
        raise ConfigError(f"--claim states one claim and study {spec.name} asks {len(asked)} questions: add "
                          "--statistic to ask one")
    questions = []
    for q in asked:
        name = q.statistic.name
        x = at_x if at_x is not None and name in ("gap_at", "best_margin") else q.at_x
        if name == "gap_at" and x is None:
            raise ConfigError(f"--statistic gap_at needs --at, the {spec.x_label} to compare at (one of "
                              f"{', '.join(fmt_x(v) for v in xs)})")
        words = check_claim(claim) if claim is not None else claim_text(
            name, better, base, spec.x_label, x if name == "gap_at" else q.baseline_x, q.paper_sign)
        questions.append(Question(words, q.statistic, better, base, label=LABELS.get(name, q.label),
                                  paper_sign=q.paper_sign, baseline_x=q.baseline_x, at_x=x, own=True))
    return replace(spec, questions=tuple(questions), pairs=((better, base),))
