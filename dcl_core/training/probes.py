"""Evaluation of a trained backbone on a run's data: the kNN monitor and the linear probe.

Both extract frozen features with the deterministic test-time transform (:meth:`TrainingData.features`) and
hand them to the pure functions of :mod:`dcl_core.eval`. The trainer calls them during and after training;
``python -m dcl_core.evaluate`` calls them on a saved checkpoint.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from dcl_core.eval import LINEAR_PRESETS, knn_top1, linear_probe
from dcl_core.training.builders import TrainingData

log = logging.getLogger(__name__)


def evaluate_knn(
    backbone: nn.Module, data: TrainingData, k: int, temperature: float, batch_size: int, device: torch.device
) -> float:
    """The kNN top-1 (%) of the test set against the labeled train bank, test-time transforms for both.

    Args:
        backbone: the encoder without its projection head (not DDP-wrapped).
        data: the run's datasets; the bank and test splits are used.
        k: neighbours voting per test image.
        temperature: the kNN monitor's own temperature (never the training τ).
        batch_size: feature-extraction batch size.
        device: where the features are extracted.
    """
    bank = data.features(backbone, "bank", batch_size, device)
    test = data.features(backbone, "test", batch_size, device)
    return knn_top1(
        test, data.labels("test"), bank, data.labels("bank"), data.num_classes, k=k, temperature=temperature
    )


def linear_eval(
    backbone: nn.Module, data: TrainingData, preset: str, seed: int, batch_size: int, device: torch.device
) -> dict[str, float]:
    """Linear probe on frozen, unnormalised features: train on the bank split, test on the test split.

    Args:
        backbone: the encoder without its projection head (not DDP-wrapped).
        data: the run's datasets.
        preset: the probe's protocol, a key of :data:`~dcl_core.eval.LINEAR_PRESETS` (``paper``, ``cpu``,
            ``smoke``).
        seed: seeds the classifier's initialisation and shuffling.
        batch_size: feature-extraction batch size.
        device: where the features are extracted and the probe trains.

    Returns:
        ``{"eval/linear_top1": ..., "eval/linear_train_top1": ...}`` in percent.
    """
    train_f = data.features(backbone, "bank", batch_size, device, normalize=False)
    test_f = data.features(backbone, "test", batch_size, device, normalize=False)
    res = linear_probe(
        train_f,
        data.labels("bank"),
        test_f,
        data.labels("test"),
        data.num_classes,
        LINEAR_PRESETS[preset],
        seed=seed,
        device=device,
    )
    log.info("linear probe (%s): top-1 %.2f%%", preset, res["linear_top1"])
    return {f"eval/{k}": v for k, v in res.items()}
