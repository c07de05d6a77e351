"""The only place that reads a :class:`~dcl_core.config.Config` to build library objects.

Everything built here receives explicit values, so losses, models and data code never see the config.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch import nn

from dcl_core.config import Config, Derived
from dcl_core.data import (
    EvalTransform,
    ImageTensors,
    ViewAugmentation,
    load_dataset,
    normalization_for,
)
from dcl_core.frameworks import FRAMEWORKS
from dcl_core.losses import LOSSES, ContrastiveLoss
from dcl_core.models import ProjectionHead, SSLModel, build_backbone

log = logging.getLogger(__name__)


def build_loss(cfg: Config, derived: Derived) -> ContrastiveLoss:
    """The configured loss with exactly the arguments its equation takes."""
    lc = cfg.loss
    common = {"temperature": lc.temperature, "gather_distributed": lc.gather_distributed}
    extra: dict[str, object] = {
        "infonce": {},
        "dcl": {},
        "dclw": {"sigma": lc.sigma},
        "dclw_exp": {"sigma": lc.sigma, "delta": lc.delta},
        "eqco": {"alpha": derived.eqco_alpha, "num_negatives": lc.num_negatives},
        "align_uniform": {"uniformity_t": lc.uniformity_t, "uniformity_weight": lc.uniformity_weight},
    }[lc.name]
    return LOSSES[lc.name](**common, **extra)


def build_model(cfg: Config) -> SSLModel:
    """Backbone (ResNet with the configured stem/width) + 2-layer MLP projection head."""
    mc = cfg.model
    backbone, feat_dim = build_backbone(mc.arch, width=mc.width, stem=mc.stem)
    head = ProjectionHead(feat_dim, mc.proj_hidden_dim, mc.proj_dim)
    return SSLModel(backbone, head)


def build_framework(cfg: Config, model: nn.Module, loss: ContrastiveLoss) -> nn.Module:
    """The configured framework around ``model`` (already on its device) and ``loss``, with explicit values.

    MoCo/NNCLR queues hold ``model.proj_dim``-dimensional projections. MoCo always gathers keys over DDP ranks
    before enqueuing; SiMo's keys and NNCLR's in-batch negatives follow ``loss.gather_distributed``.
    """
    fc = cfg.framework
    extra: dict[str, object] = {
        "simclr": {},
        "moco": {"dim": cfg.model.proj_dim, "queue_size": fc.queue_size, "momentum": fc.momentum},
        "simo": {
            "momentum": fc.momentum,
            "num_negatives": fc.num_negatives,
            "gather_distributed": cfg.loss.gather_distributed,
        },
        "nnclr": {
            "dim": cfg.model.proj_dim,
            "queue_size": fc.queue_size,
            "gather_distributed": cfg.loss.gather_distributed,
        },
    }[fc.name]
    return FRAMEWORKS[fc.name](model, loss, **extra)


def build_optimizer(cfg: Config, derived: Derived, model: nn.Module) -> torch.optim.Optimizer:
    """SGD with momentum; the lr is set every step by the schedule (peak = ``derived.lr``)."""
    oc = cfg.optim
    return torch.optim.SGD(
        model.parameters(), lr=derived.lr, momentum=oc.momentum, weight_decay=oc.weight_decay
    )


@dataclass
class TrainingData:
    """Images kept in memory as uint8, plus the transforms that run on the training device."""

    pretrain: ImageTensors  # SSL pretraining images (labels unused)
    bank: ImageTensors  # labeled train images: kNN memory bank / linear-probe train set
    test: ImageTensors  # labeled test images
    augment: ViewAugmentation
    eval_transform: EvalTransform
    num_classes: int


def build_data(cfg: Config) -> TrainingData:
    """Load (and subset) the datasets; raises DataError with one line if they are missing."""
    dc = cfg.data
    # Stored at the training size: a larger stored image (STL-10's 96 px at image_size 32) would be shrunk by
    # the view augmentation's crop without antialiasing, while the eval transform antialiases.
    size = dc.image_size
    # Seeded class-balanced subsets; for ImageFolder layouts only the chosen files are decoded.
    bank = load_dataset(
        dc.dataset, "train", dc.root, dc.download, size, per_class=dc.train_per_class, seed=cfg.seed
    )
    test = load_dataset(
        dc.dataset, "test", dc.root, dc.download, size, per_class=dc.test_per_class, seed=cfg.seed
    )
    if dc.dataset == "stl10":
        # The paper pretrains STL-10 on train + unlabeled; the subset size applies to the labeled part only.
        pretrain = load_dataset(dc.dataset, "pretrain", dc.root, dc.download, size)
    else:
        pretrain = bank
    mean, std = normalization_for(dc.dataset)
    augment = ViewAugmentation(
        dc.image_size,
        policy=dc.augmentation,
        mean=mean,
        std=std,
        crop_scale=(dc.crop_min_scale, 1.0),
        jitter_strength=dc.jitter_strength,
    )
    log.info(
        "data: %d pretraining images, %d bank, %d test, %d classes",
        len(pretrain),
        len(bank),
        len(test),
        bank.num_classes,
    )
    return TrainingData(
        pretrain, bank, test, augment, EvalTransform(dc.image_size, mean, std), bank.num_classes
    )
