"""The numeric range a config value or a loss's parameter accepts (:class:`Range`), shown by ``--help`` and checked
by the config's validation. Torch-free, and imports nothing of the project."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Range:
    """The values a numeric field accepts, checked by :func:`validate` and shown by ``--help`` as ``range ...``.

    ``gt``/``ge`` and ``lt``/``le`` bound the quantity's domain (a momentum lies in [0, 1), a temperature is
    > 0); ``cap`` is a practical upper limit where the domain has none (τ <= 100: the losses divide by τ and
    must stay finite, and no study needs more). A float field must also be finite. Messages name the violated
    bound (``loss.temperature must be > 0``, ``... must be <= 100``), or the interval when the domain is
    bounded on both sides (``framework.momentum must be in [0, 1)``); ``why`` is appended to them.
    """

    gt: float | None = None
    ge: float | None = None
    lt: float | None = None
    le: float | None = None
    cap: float | None = None
    why: str = ""

    def _lower(self) -> tuple[str, str]:
        """``("(", "0")``: the interval's opening bracket and lower bound."""
        if self.gt is not None:
            return "(", _num(self.gt)
        return ("[", _num(self.ge)) if self.ge is not None else ("(", "-inf")

    def _upper(self) -> tuple[str, str]:
        """``("100", "]")``: the upper bound and closing bracket (the cap's when the domain has none)."""
        if self.lt is not None:
            return _num(self.lt), ")"
        if self.le is not None:
            return _num(self.le), "]"
        return (_num(self.cap), "]") if self.cap is not None else ("inf", ")")

    def __str__(self) -> str:
        (bracket, low), (high, close) = self._lower(), self._upper()
        return f"{bracket}{low}, {high}{close}"

    def problem(self, value: float) -> str | None:
        """What ``value`` must be instead (``"> 0"``, ``"in [0, 1)"``), or None if it is in range."""
        two_sided = (self.gt is not None or self.ge is not None) and (self.lt is not None or self.le is not None)
        domain = "in " + str(self) if two_sided else None
        if isinstance(value, float) and not math.isfinite(value):
            return f"in {self}"
        if (self.gt is not None and not value > self.gt) or (self.ge is not None and not value >= self.ge):
            return domain or (f"> {_num(self.gt)}" if self.gt is not None else f">= {_num(self.ge)}")
        if (self.lt is not None and not value < self.lt) or (self.le is not None and not value <= self.le):
            return domain or (f"< {_num(self.lt)}" if self.lt is not None else f"<= {_num(self.le)}")
        if self.cap is not None and value > self.cap:
            return f"<= {_num(self.cap)}"
        return None


def _num(x: float | None) -> str:
    """``0``, ``0.5``, ``1e+06``: a bound as written in messages and ``--help``."""
    return f"{x:g}" if isinstance(x, float) else str(x)
