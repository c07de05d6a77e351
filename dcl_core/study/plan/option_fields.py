"""How a study option is declared: one dataclass field, its command-line flag, group, help and bounds in the field's
metadata (:func:`option`). The options that say how a study runs are fields of
:class:`~dcl_core.study.plan.run_options.StudyOptions`, the rest fields of
:class:`~dcl_core.study.plan.args.StudyArgs`; the command line's parser (:mod:`dcl_core.study.cli.options`) reads
both, so each option is declared once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import field
from typing import Any

MAX_TEXT = 4096  # a recorded path, name or KEY=VALUE
# the sections of a study's --help, in this order
WHAT, QUESTION = "what to run", "your own question (docs/own-loss.md): replaces the paper's"
ROUNDS, WHERE, RESOURCES = "seeds until resolved", "where results go", "resources"
GROUPS = (WHAT, QUESTION, ROUNDS, WHERE, RESOURCES)


def option(default: Any, flag: str | None, group: str | None, help: str = "", *, record: bool = False,
           bounds: tuple[float, float | None] | None = None, limit: int = MAX_TEXT, items: int | None = None,
           choices: tuple[str, ...] | None = None, metavar: str | None = None, short: str | None = None,
           check: Callable[[Any], Any] | None = None, only: bool = False, fixed_on_resume: bool = False) -> Any:
    """A study option's field: its command-line ``flag`` (None: not on the command line) in ``group``;
    ``only``: on the command line of the scripts that ask for it only (``build_parser``'s ``extra``);
    ``record``: kept in the study's record of its command and replayed from it; ``bounds``: a number's (low, high
    or None); ``limit`` and ``items``: a recorded text's length and a recorded list's length; ``check``: the
    recorded value's own validation (ConfigError); ``fixed_on_resume``: a ``--resume`` must keep it (Tune pickles
    the callbacks and scheduler a study started with)."""
    meta = {"flag": flag, "group": group, "help": help, "record": record, "bounds": bounds, "limit": limit,
            "items": items, "choices": choices, "metavar": metavar, "short": short, "check": check, "only": only,
            "fixed_on_resume": fixed_on_resume}
    return field(default=default, metadata=meta)
