"""Single-run training: builders (the only config readers), schedule, checkpoints, the trainer."""

from dcl_core.training.trainer import EpochCallback, NonFiniteLossError, TrainResult, train

__all__ = ["EpochCallback", "NonFiniteLossError", "TrainResult", "train"]
