"""A loss from the user's own code, named in ``loss.name`` beside the built-in names: ``my_losses:MyLoss`` (an
importable module) or ``path/to/my_loss.py:MyLoss`` (a file), and its own keyword arguments in ``loss.params``
(a JSON object: ``{"positive_weight": 0.5}``). Only the syntax is checked here, torch-free and without importing
anything: :mod:`dcl_core.losses.user` imports the code when a run builds its loss.
"""

from __future__ import annotations

import json
import keyword
import math
import os
import re
import reprlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from dcl_core.config.schema import ConfigError

# A module's dotted name: identifiers joined by dots (``pkg.my_losses``); a class: one identifier.
_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
MAX_PARAMS_CHARS = 4096  # a handful of keyword arguments; a typo'd paste of a file is refused, not parsed
REFERENCE_FORMS = "module:Class or path/to/file.py:Class"


@dataclass(frozen=True)
class LossReference:
    """Where a user loss lives: ``module`` (dotted, importable) or ``file`` (a ``.py`` path), and its class."""

    attr: str
    module: str = ""
    file: str = ""

    def __str__(self) -> str:
        return f"{self.file or self.module}:{self.attr}"


@dataclass(frozen=True)
class LossSource:
    """What a user loss is made of, as a study records it: the loss's own ``file``, the folder ``root`` of Python
    sources it is hashed with, each of those ``files`` (path relative to ``root``, SHA-256) and their ``digest``
    (the SHA-256 of that list): a resume whose loss's digest changed is refused, naming the files that changed."""

    name: str
    file: str
    digest: str
    root: str = ""
    files: tuple[tuple[str, str], ...] = ()


def loss_reference(name: str, key: str = "loss.name") -> LossReference | None:
    """The user loss ``name`` names, or None for a name without ``:`` (a built-in's, checked by its choices);
    ``key`` is the option messages name.

    Raises:
        ConfigError: a ``:`` reference that is neither form (one line naming both).
    """
    if ":" not in name:
        return None
    where, _, attr = name.rpartition(":")
    if not _IDENTIFIER.fullmatch(attr) or keyword.iskeyword(attr):
        raise ConfigError(f"{key}={name!r}: after the ':' must come a class or function name ({REFERENCE_FORMS})")
    if where.endswith(".py") and where[:-3]:
        return LossReference(attr=attr, file=where)
    if _DOTTED.fullmatch(where) and not any(keyword.iskeyword(part) for part in where.split(".")):
        return LossReference(attr=attr, module=where)
    raise ConfigError(f"{key}={name!r}: before the ':' must come an importable module or a .py file "
                      f"({REFERENCE_FORMS})")


def absolute_reference(name: str) -> str:
    """A user loss's ``file.py:Class`` with the file's absolute path (``~`` expanded), as a run and a study record
    it: their records, and the trials Tune runs in folders of their own, find the same file. Other names as given:
    a built-in's, a module's, and a malformed one (refused later, with the config's message)."""
    try:
        ref = loss_reference(name)
    except ConfigError:
        return name
    return f"{os.path.abspath(os.path.expanduser(ref.file))}:{ref.attr}" if ref is not None and ref.file else name


def loss_label(name: str) -> str:
    """A loss as tables, trial names and figures show it: a built-in's name, a user loss's class name."""
    ref = loss_reference(name) if isinstance(name, str) else None
    return ref.attr if ref is not None else name


def loss_params(text: str) -> dict[str, Any]:
    """``loss.params`` as keyword arguments: a JSON object of names to numbers, strings, booleans or null.

    Raises:
        ConfigError: not JSON, not an object, a name given twice or that is no identifier, a nested or non-finite
            value.
    """
    if len(text) > MAX_PARAMS_CHARS:
        raise ConfigError(f"loss.params is {len(text)} characters; at most {MAX_PARAMS_CHARS}")

    def once(pairs: list[tuple[str, Any]]) -> dict[str, Any]:  # JSON keeps the last of a key given twice
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise ConfigError(f"loss.params: {key} is given twice ({text!r}); give each keyword once")
            seen.add(key)
        return dict(pairs)

    try:
        params = json.loads(text, object_pairs_hook=once)
    except json.JSONDecodeError as err:
        raise ConfigError(f"loss.params must be a JSON object such as '{{\"weight\": 0.5}}': {err.msg} at "
                          f"character {err.pos}") from None
    except RecursionError:  # 4096 characters can nest deeper than Python's parser follows
        raise ConfigError("loss.params must be a JSON object such as '{\"weight\": 0.5}': it nests deeper than "
                          "a keyword argument's value ever does") from None
    if not isinstance(params, dict):
        raise ConfigError(f"loss.params must be a JSON object such as '{{\"weight\": 0.5}}', got {text!r}")
    for key, value in params.items():
        if not _IDENTIFIER.fullmatch(key) or keyword.iskeyword(key):
            raise ConfigError(f"loss.params: {key!r} is not a keyword argument name")
        if key in ("temperature", "gather_distributed"):
            raise ConfigError(f"loss.params: {key} is set by loss.{key}, not here")
        if isinstance(value, (dict, list)):
            raise ConfigError(f"loss.params: {key} must be a number, string, boolean or null, got "
                              f"{reprlib.repr(value)}")  # shortened: a nested value can be 4,000 characters
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"loss.params: {key} must be finite, got {value}")
    return params


def check_params_used(params: str, names: Iterable[str]) -> None:
    """ConfigError (one line) when ``loss.params`` holds keyword arguments but none of the losses ``names`` (a run's
    one, or every loss a study names) is a user loss: only a user loss receives them (a built-in takes its own keys,
    ``loss.sigma``, ``loss.alpha``), so they would be ignored silently. A study comparing a user loss with built-in
    ones sets them for the user loss: accepted."""
    names = sorted(set(names))
    if not loss_params(params) or any(loss_reference(n) is not None for n in names):
        return
    which = (f"loss.name={names[0]} is a built-in loss, which takes its" if len(names) == 1 else
             f"loss.name={', '.join(names)} are built-in losses, which take their")
    raise ConfigError(f"loss.params is given but {which} own keys (loss.sigma, loss.alpha, ...), not loss.params: "
                      f"drop loss.params, or name your own loss (loss.name={REFERENCE_FORMS})")
