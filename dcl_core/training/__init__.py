"""Single-run training: builders (the only config readers), schedule, checkpoints, evaluation, the trainer."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dcl_core.training.trainer import EpochCallback, NonFiniteLossError, RunOutputError, TrainResult, train

__all__ = ["EpochCallback", "NonFiniteLossError", "RunOutputError", "TrainResult", "train"]


def __getattr__(name: str) -> Any:
    # Lazy: importing a submodule runs this file first, and `import dcl_core.training.checkpoint` (e.g. to
    # read a checkpoint's file name or load one for evaluation) should not import the trainer with its models,
    # losses, frameworks and data code.
    if name in __all__:
        from dcl_core.training import trainer  # the models, losses and data code: on first use

        return getattr(trainer, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
