"""The config presets: ``smoke`` (tests, seconds), ``cpu`` (answers a question on 2 cores in minutes), ``paper``
and ``paper_imagenet`` (the papers' GPU protocols)."""

from __future__ import annotations

from typing import Any

from dcl_core.config.keys import apply_overrides
from dcl_core.config.schema import Config, ConfigError

PRESETS: dict[str, dict[str, Any]] = {
    "smoke": {
        "data.train_per_class": 16,
        "data.test_per_class": 8,
        "model.width": 0.125,
        "model.proj_hidden_dim": 64,
        "optim.epochs": 2,
        "optim.batch_size": 32,
        "eval.knn_k": 20,
        "eval.linear_preset": "smoke",
    },
    # ~3 min on 2 idle cores (`benchmarks/run.py --sections levers,roofline` measures its step); kNN top-1 rises
    # from ~33% after one epoch to ~45% after 15 for DCL and InfoNCE alike (chance: 10%).
    "cpu": {
        "data.train_per_class": 500,
        "data.test_per_class": 100,
        "model.width": 0.25,
        "model.proj_hidden_dim": 128,
        "optim.epochs": 15,
        "optim.batch_size": 128,
        "optim.base_lr": 0.06,
        "optim.warmup_epochs": 1.0,
        "eval.linear_preset": "cpu",
    },
    # DCL Sec. 4.1 / Table 1: ResNet-18, CIFAR stem, 200 epochs, batch 256, base lr 0.03 * bs/256, tau 0.07,
    # kNN evaluation; A.4 augmentations (jitter strength 1.0); A.4 linear protocol.
    "paper": {
        "model.width": 1.0,
        "model.proj_hidden_dim": 512,
        "optim.epochs": 200,
        "optim.batch_size": 256,
        "optim.base_lr": 0.03,
        "loss.temperature": 0.07,
        "data.jitter_strength": 1.0,
        "eval.linear_preset": "paper",
    },
    # The ImageNet-style protocol (DCL Tables 3, 5, 6; EqCo Figs. 3-4): ResNet-50, 224 px ImageFolder root
    # (ImageNet-100 or -1K, pass --data-root), batch 256, 200 epochs, base lr 0.3, tau 0.1.
    "paper_imagenet": {
        "data.dataset": "imagefolder",
        "data.loader": "stream",
        "data.image_size": 224,
        "data.jitter_strength": 1.0,
        "model.arch": "resnet50",
        "model.stem": "imagenet",
        "model.proj_hidden_dim": 2048,
        "optim.epochs": 200,
        "optim.batch_size": 256,
        "optim.base_lr": 0.3,
        "loss.temperature": 0.1,
        "eval.knn_every": 10,
        "eval.linear_preset": "paper",
    },
}


def preset(name: str) -> Config:
    """The config of a named preset (``smoke``, ``cpu``, ``paper``, ``paper_imagenet``)."""
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; choose from {', '.join(PRESETS)}")
    return apply_overrides(Config(), PRESETS[name])


