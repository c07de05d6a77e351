"""The rows of a loss's check (torch-free, so that the process that prints them never loads the loss): one
:class:`Check` a property and setting, how a measured error becomes a row (NaN and ∞ always fail), the table and
the summary line ``python -m dcl_core.losses check`` prints, and the temperatures and inputs the rows name."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

TAUS = (0.005, 0.07, 0.2, 1.0)
# The batches of the finiteness rows: the built-in losses' adversarial inputs.
INPUT_KINDS = ("random", "identical", "antipodal", "aligned", "collapsed", "huge", "tiny")
# The batches the gradient and the layout are checked on: spread (random) and nearly saturated (each positive
# close to its anchor, the negatives spread: at small τ the positive's softmax weight is nearly 1).
GRADIENT_KINDS = ("random", "saturated")
# The batches a reference is compared on: the clamps and max branches of an equation show on the structured ones.
REFERENCE_KINDS = ("random", "saturated", "aligned", "collapsed", "antipodal")


@dataclass(frozen=True)
class Check:
    """One property's verdict: ``ok``, the worst error measured and the tolerance (NaN where none applies);
    ``applies`` False for a property the loss's form makes moot (``n/a``: it neither holds nor fails)."""

    name: str
    setting: str
    ok: bool
    error: float = math.nan
    tolerance: float = math.nan
    detail: str = ""
    applies: bool = True

    def as_dict(self) -> dict[str, Any]:
        """The fields, for the JSON line an isolated check sends its parent."""
        return asdict(self)


def measured(name: str, setting: str, error: float, tolerance: float, detail: str = "") -> Check:
    """A row that holds when ``error <= tolerance``: a NaN or infinite error fails (and says so)."""
    ok = error <= tolerance
    if not math.isfinite(error):
        detail = f"the measured error is {error} (NaN or ∞ in the loss or its gradient)" + (
            f"; {detail}" if detail else "")
    return Check(name, setting, ok, error, tolerance, "" if ok else detail)


def worst(errors: list[float]) -> float:
    """The largest error; NaN if any is NaN (``max`` alone would keep a finite value beside a NaN)."""
    if any(math.isnan(e) for e in errors):
        return math.nan
    return max(errors, default=0.0)


def first_line(err: BaseException) -> str:
    """An exception as one line: its type and its message's first line."""
    text = str(err)
    return f"{type(err).__name__}: {text.splitlines()[0] if text else ''}"


def not_applicable(name: str, setting: str, why: str) -> Check:
    """The row of a property that does not apply to the loss, and why."""
    return Check(name, setting, True, detail=why, applies=False)


def contract_failed(checks: list[Check]) -> list[Check]:
    """``checks`` and, when the contract failed, the row that says why nothing else ran."""
    return [*checks, Check("others", "not run", False, detail="the contract fails; fix it first")]


def format_checks(name: str, checks: list[Check], reference: str | None = None) -> str:
    """The table ``python -m dcl_core.losses check`` prints: a row a property, then :func:`summary`."""
    rows = [f"{'property':<12} {'setting':<44} {'result':<6} {'error':>9} {'tolerance':>9}  detail"]
    for c in checks:
        err = "" if math.isnan(c.error) and math.isnan(c.tolerance) else f"{c.error:.2e}"  # nan: measured NaN
        tol = "" if math.isnan(c.tolerance) else f"{c.tolerance:.0e}"
        result = "n/a" if not c.applies else "pass" if c.ok else "FAIL"
        rows.append(f"{c.name:<12} {c.setting:<44} {result:<6} {err:>9} {tol:>9}  {c.detail}")
    rows.append(summary(name, checks, reference))
    return "\n".join(rows)


def summary(name: str, checks: list[Check], reference: str | None = None) -> str:
    """One line: how many rows hold, which failed, which did not apply, and what a pass did not check."""
    failed = [c for c in checks if not c.ok]
    moot = [c for c in checks if not c.applies]
    measured_rows = len(checks) - len(moot)
    if failed:
        names = ", ".join(dict.fromkeys(c.name for c in failed))
        return f"{name}: {len(failed)} of {measured_rows} checks failed ({names}): see the rows marked FAIL"
    line = f"{name}: {measured_rows} of {measured_rows} checks hold"
    if moot:
        line += f" ({', '.join(dict.fromkeys(c.name for c in moot))}: n/a, see its row)"
    if reference is None:
        return line + ("; the equation itself is unchecked: give --reference (a plain-loop transcription of it) "
                       "to compare its value and gradient")
    taus = sum(c.name == "reference" for c in checks)
    return line + (f"; its value and gradient equal {reference}'s at {taus} temperatures on "
                   f"{len(REFERENCE_KINDS)} kinds of input ({', '.join(REFERENCE_KINDS)})")
