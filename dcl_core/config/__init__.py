"""The single source of truth for a run: one typed, frozen dataclass tree.

Every knob is a field here, addressed by a dotted key (``loss.temperature``). The CLI, Ray's ``param_space``
and the Optuna spaces in ``search_spaces/`` all produce exactly these keys, and :func:`apply_overrides` is the
only way to change them: unknown keys, wrong types and out-of-range values raise :class:`ConfigError` before
any compute starts. Derived quantities (the scaled learning rate, EqCo's K, per-rank batch) are computed in one
place, :func:`derive`, and nothing mutates a config during a run.

Each field carries ``help`` (shown by ``python -m dcl_core.train --help``) and, where the papers fix a value,
``paper`` (the DCL / EqCo protocol value).

Example:
    >>> cfg = apply_overrides(preset("cpu"), {"loss.name": "dcl", "loss.temperature": 0.1})
    >>> derive(cfg).lr  # base_lr * batch / 256
    0.03

A module a job: :mod:`.schema` (the sections, fields and names), :mod:`.keys` (dotted keys and overrides),
:mod:`.validation` (combination checks), :mod:`.presets`, :mod:`.derive`, :mod:`.negatives` (each framework's
negatives and the key that sets its K), :mod:`.loss_registry` (the built-in losses as their own files declare them,
read without importing them), :mod:`.bounds` (numeric ranges), :mod:`.user_loss` (a loss from the user's code,
named in ``loss.name``). Import from here; the config imports nothing else of the project.
"""

from dcl_core.config.derive import Derived, derive
from dcl_core.config.keys import apply_overrides, from_flat_dict, parse_overrides, to_flat_dict
from dcl_core.config.loss_registry import BUILTIN_LOSSES, LOSS_SPECS, LossParam, LossSpec
from dcl_core.config.negatives import NEGATIVES, Negatives
from dcl_core.config.presets import PRESETS, preset
from dcl_core.config.schema import (
    ARCH_NAMES,
    AUGMENTATIONS,
    CONFIG_KEYS,
    DATA_LOADERS,
    DATASET_NAMES,
    DEVICES,
    FRAMEWORK_NAMES,
    LOSS_NAMES,
    STEM_NAMES,
    Config,
    ConfigError,
    DataConfig,
    EvalConfig,
    FrameworkConfig,
    InputError,
    LossConfig,
    ModelConfig,
    OptimConfig,
    Range,
    RunFailedError,
    field_specs,
    value_at,
)
from dcl_core.config.user_loss import (
    REFERENCE_FORMS,
    LossReference,
    LossSource,
    absolute_reference,
    check_params_used,
    loss_label,
    loss_params,
    loss_reference,
)
from dcl_core.config.validation import check_device, validate

__all__ = [
    "ARCH_NAMES",
    "AUGMENTATIONS",
    "BUILTIN_LOSSES",
    "CONFIG_KEYS",
    "DATASET_NAMES",
    "DATA_LOADERS",
    "DEVICES",
    "FRAMEWORK_NAMES",
    "LOSS_NAMES",
    "LOSS_SPECS",
    "NEGATIVES",
    "PRESETS",
    "REFERENCE_FORMS",
    "STEM_NAMES",
    "Config",
    "ConfigError",
    "DataConfig",
    "Derived",
    "EvalConfig",
    "FrameworkConfig",
    "InputError",
    "LossConfig",
    "LossParam",
    "LossReference",
    "LossSource",
    "LossSpec",
    "ModelConfig",
    "Negatives",
    "OptimConfig",
    "Range",
    "RunFailedError",
    "absolute_reference",
    "apply_overrides",
    "check_device",
    "check_params_used",
    "derive",
    "field_specs",
    "from_flat_dict",
    "loss_label",
    "loss_params",
    "loss_reference",
    "parse_overrides",
    "preset",
    "to_flat_dict",
    "validate",
    "value_at",
]
