"""Dotted keys (``loss.temperature``): the one way to change a config (:func:`apply_overrides`, which validates
the result), ``--set KEY=VALUE`` parsing, and the flat form Ray's ``param_space`` and checkpoints use."""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

from dcl_core.config.schema import CONFIG_KEYS, Config, ConfigError, field_specs
from dcl_core.config.validation import validate


def _coerce(key: str, tp: Any, value: Any) -> Any:
    """Check (and losslessly convert) ``value`` for a field of type ``tp``; raise ConfigError otherwise."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        is_none = value is None or (isinstance(value, str) and value.lower() in ("none", "null"))
        if is_none and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(key, inner[0], value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "1", "yes", "false", "0", "no"):
            return value.lower() in ("true", "1", "yes")
        raise ConfigError(f"{key} must be true/false, got {value!r}")
    if tp is int:
        # numpy / Optuna integers are fine; floats with a fractional part and bools are not.
        if isinstance(value, bool):
            raise ConfigError(f"{key} must be an integer, got {value!r}")
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                raise ConfigError(f"{key} must be an integer, got {value!r}") from None
        if hasattr(value, "__index__"):
            return int(value)
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(f"{key} must be an integer, got {value!r}")
    if tp is float:
        if isinstance(value, bool):
            raise ConfigError(f"{key} must be a number, got {value!r}")
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{key} must be a number, got {value!r}") from None
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key} must be a string, got {value!r}")
        return value
    raise ConfigError(f"{key}: unsupported field type {tp}")  # pragma: no cover - a bug in this module


def apply_overrides(cfg: Config, overrides: dict[str, Any]) -> Config:
    """Return a new config with dotted-key ``overrides`` applied and the result validated.

    Raises:
        ConfigError: unknown key, wrong type, or a value out of range (one line).
    """
    specs = field_specs()
    grouped: dict[str, dict[str, Any]] = {}
    top: dict[str, Any] = {}
    for key, value in overrides.items():
        if key not in specs:
            close = [k for k in specs if k.split(".")[-1] == key.split(".")[-1]]
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise ConfigError(f"unknown config key {key!r}{hint}")
        tp, _ = specs[key]
        coerced = _coerce(key, tp, value)
        if "." in key:
            section, name = key.split(".", 1)
            grouped.setdefault(section, {})[name] = coerced
        else:
            top[key] = coerced
    for section, values in grouped.items():
        top[section] = dataclasses.replace(getattr(cfg, section), **values)
    new = dataclasses.replace(cfg, **top)
    validate(new)
    return new


def parse_overrides(items: list[str]) -> dict[str, str]:
    """``["loss.temperature=0.2", ...]`` (the command lines' ``--set`` values) as ``{key: value}`` strings,
    for :func:`apply_overrides` to check and convert.

    Raises:
        ConfigError: an item without ``=``; a key given twice (which value was meant is not ours to guess).
    """
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--set expects KEY=VALUE, got {item!r}")
        key = key.strip()
        if key in out and out[key] != value.strip():
            raise ConfigError(f"--set {key} is given twice ({out[key]!r} and {value.strip()!r}); give it once")
        out[key] = value.strip()
    return out


def to_flat_dict(cfg: Config) -> dict[str, Any]:
    """``{"loss.temperature": 0.1, ...}`` for every leaf: MLflow params, checkpoints, provenance."""
    out: dict[str, Any] = {}
    for key in CONFIG_KEYS:
        obj: Any = cfg
        for part in key.split("."):
            obj = getattr(obj, part)
        out[key] = obj
    return out


def from_flat_dict(flat: dict[str, Any]) -> Config:
    """Inverse of :func:`to_flat_dict` (validates)."""
    return apply_overrides(Config(), flat)


