"""The only place that reads a :class:`~dcl_core.config.Config` to build library objects.

Everything built here receives explicit values, so losses, models and data code never see the config.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import nn

from dcl_core.config import LOSS_SPECS, Config, Derived, value_at
from dcl_core.data import (
    DataError,
    EvalTransform,
    ImageTensors,
    ViewAugmentation,
    load_dataset,
    normalization_for,
    split_location,
)
from dcl_core.data.streaming import FolderSplit, TwoViews, epoch_loader, eval_batches, eval_transform, folder_split
from dcl_core.eval.features import extract_features, extract_features_from_batches, fitting_batch_size
from dcl_core.frameworks import FRAMEWORKS
from dcl_core.frameworks.common import Framework
from dcl_core.losses import LOSSES, ContrastiveLoss
from dcl_core.losses.user import build_user_loss
from dcl_core.models import ProjectionHead, SSLModel, build_backbone

log = logging.getLogger(__name__)


def build_loss(cfg: Config, derived: Derived) -> ContrastiveLoss:
    """The configured loss with exactly the arguments its spec declares (its ``loss.<param>`` options, or the
    derived value a parameter names); a user loss: τ, the DDP gathering and its ``loss.params``."""
    lc = cfg.loss
    if lc.name not in LOSSES:
        return build_user_loss(lc.name, lc.params, lc.temperature, lc.gather_distributed)
    cls = LOSSES[lc.name]
    own = {p.name: getattr(derived, p.derived) if p.derived else value_at(cfg, f"loss.{p.name}")
           for p in LOSS_SPECS[lc.name].params}
    return cls(temperature=lc.temperature, gather_distributed=lc.gather_distributed, **own)


def build_model(cfg: Config) -> SSLModel:
    """Backbone (ResNet with the configured stem/width) + 2-layer MLP projection head."""
    mc = cfg.model
    backbone, feat_dim = build_backbone(mc.arch, width=mc.width, stem=mc.stem)
    head = ProjectionHead(feat_dim, mc.proj_hidden_dim, mc.proj_dim)
    return SSLModel(backbone, head)


def model_state_bytes(cfg: Config) -> int:
    """Bytes of every value (weights and BatchNorm buffers) of the model :func:`build_model` builds for ``cfg``: what
    a checkpoint of it holds. Built on PyTorch's meta device (shapes only: no memory, no arithmetic), so a config
    that asks for 22 GiB of weights is measured before anything is allocated."""
    with torch.device("meta"):
        model = build_model(cfg)
    return sum(t.numel() * t.element_size() for t in model.state_dict().values())


def build_framework(cfg: Config, model: nn.Module, loss: ContrastiveLoss) -> Framework:
    """The configured framework around ``model`` (already on its device) and ``loss``, with explicit values.

    MoCo/NNCLR queues hold ``model.proj_dim``-dimensional projections. MoCo always gathers keys over DDP ranks
    before enqueuing; SiMo's keys and NNCLR's in-batch negatives follow ``loss.gather_distributed``.
    """
    fc = cfg.framework
    extras: dict[str, dict[str, Any]] = {
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
    }
    return FRAMEWORKS[fc.name](model, loss, **extras[fc.name])


def build_optimizer(cfg: Config, derived: Derived, model: nn.Module) -> torch.optim.Optimizer:
    """SGD with momentum; the lr is set every step by the schedule (peak = ``derived.lr``)."""
    oc = cfg.optim
    return torch.optim.SGD(
        model.parameters(), lr=derived.lr, momentum=oc.momentum, weight_decay=oc.weight_decay
    )


class TrainingData(Protocol):
    """What training and evaluation need from a dataset, in memory or streamed from an ImageFolder."""

    num_classes: int

    def __len__(self) -> int:
        """Number of pretraining images (indices of the epoch permutation)."""
        ...

    def epoch_views(
        self, batches: Sequence[torch.Tensor], generator: torch.Generator, device: torch.device
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The two augmented views (float (n, 3, S, S) each, on ``device``) of each batch of pretraining
        indices, in order; all randomness from ``generator`` (and the global RNG the trainer seeds)."""
        ...

    def features(
        self, backbone: nn.Module, split: str, batch_size: int, device: torch.device, normalize: bool = True
    ) -> torch.Tensor:
        """Backbone features (N, F) on CPU of the labeled ``"bank"`` (train) or ``"test"`` split, with the
        deterministic evaluation transform."""
        ...

    def labels(self, split: str) -> torch.Tensor:
        """Labels (N,) of the ``"bank"`` or ``"test"`` split, in :meth:`features` order."""
        ...


def same_device(where: torch.device, device: torch.device) -> bool:
    """Whether a tensor on ``where`` is on ``device``. A tensor names its GPU by index (``cuda:0``); ``cuda`` without
    one (what the trainer passes) matches a copy on any GPU, the one ``.to("cuda")`` chose: compared as torch
    compares them, every epoch copied the pretraining images to the GPU again (seen on an H200)."""
    return where.type == device.type and (device.index is None or where.index == device.index)


@dataclass
class InMemoryData:
    """Images kept in memory as uint8, plus the transforms that run on the training device."""

    pretrain: ImageTensors  # SSL pretraining images (labels unused)
    bank: ImageTensors  # labeled train images: kNN memory bank / linear-probe train set
    test: ImageTensors  # labeled test images
    augment: ViewAugmentation
    eval_transform: EvalTransform
    num_classes: int
    _resident: torch.Tensor | None = field(default=None, repr=False)  # the pretraining images on the GPU

    def __len__(self) -> int:
        return len(self.pretrain)

    def epoch_views(
        self, batches: Sequence[torch.Tensor], generator: torch.Generator, device: torch.device
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The epoch's two views of each batch, augmented on ``device``. On a GPU the pretraining images stay
        there (uint8: CIFAR-10's 50,000 are 154 MB), so a step gathers its batch without a copy from the host."""
        images = self.pretrain.images
        if device.type != "cpu":
            if self._resident is None or not same_device(self._resident.device, device):
                self._resident = images.to(device)
            images = self._resident
        for idx in batches:
            batch = images[idx.to(images.device, non_blocking=True)]  # uint8 (n, 3, H, W)
            yield self.augment(batch, generator)  # float (n, 3, S, S) each

    def features(
        self, backbone: nn.Module, split: str, batch_size: int, device: torch.device, normalize: bool = True
    ) -> torch.Tensor:
        """The backbone's features of the ``bank`` or ``test`` images."""
        images = {"bank": self.bank, "test": self.test}[split].images
        if len(images):
            shape = tuple(self.eval_transform(images[:1]).shape[1:])  # (3, S, S): the backbone's input
            batch_size = fitting_batch_size(backbone, shape, batch_size, device)
        return extract_features(backbone, images, self.eval_transform, batch_size, device, normalize=normalize)

    def labels(self, split: str) -> torch.Tensor:
        """The class labels of the ``bank`` or ``test`` images."""
        return {"bank": self.bank, "test": self.test}[split].labels


@dataclass
class StreamingData:
    """An ImageFolder tree read by DataLoader workers (``data.loader=stream``, see dcl_core/data/streaming.py)."""

    pretrain: FolderSplit  # two-view transform
    bank: FolderSplit  # evaluation transform
    test: FolderSplit
    num_classes: int
    workers: int

    def __len__(self) -> int:
        return len(self.pretrain)

    def epoch_views(
        self, batches: Sequence[torch.Tensor], generator: torch.Generator, device: torch.device
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The epoch's two views of each batch, augmented by the DataLoader workers."""
        pin = device.type == "cuda"
        for view1, view2 in epoch_loader(self.pretrain, batches, self.workers, generator, pin):
            yield view1.to(device, non_blocking=True), view2.to(device, non_blocking=True)

    def features(
        self, backbone: nn.Module, split: str, batch_size: int, device: torch.device, normalize: bool = True
    ) -> torch.Tensor:
        """The backbone's features of the ``bank`` or ``test`` images, read by the DataLoader workers."""
        part = {"bank": self.bank, "test": self.test}[split]
        if len(part):
            batch_size = fitting_batch_size(backbone, tuple(part.dataset[0][0].shape), batch_size, device)
        batches = eval_batches(part, batch_size, self.workers, pin=device.type == "cuda")
        return extract_features_from_batches(backbone, batches, len(part), device, normalize=normalize)

    def labels(self, split: str) -> torch.Tensor:
        """The class labels of the ``bank`` or ``test`` images."""
        return {"bank": self.bank, "test": self.test}[split].labels


def build_data(cfg: Config) -> TrainingData:
    """Load (and subset) the datasets; raises DataError with one line if they are missing."""
    dc = cfg.data
    mean, std = normalization_for(dc.dataset)
    augment = ViewAugmentation(
        dc.image_size,
        policy=dc.augmentation,
        mean=mean,
        std=std,
        crop_scale=(dc.crop_min_scale, 1.0),
        jitter_strength=dc.jitter_strength,
    )
    if dc.loader == "stream":
        return _build_streaming(cfg, augment, mean, std)
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
    log.info(
        "data: %d pretraining images, %d bank, %d test, %d classes",
        len(pretrain),
        len(bank),
        len(test),
        bank.num_classes,
    )
    return InMemoryData(
        pretrain, bank, test, augment, EvalTransform(dc.image_size, mean, std), bank.num_classes
    )


def _build_streaming(
    cfg: Config, augment: ViewAugmentation, mean: Sequence[float], std: Sequence[float]
) -> StreamingData:
    dc = cfg.data
    dirs = {}
    for split in ("train", "test"):
        kind, where = split_location(dc.dataset, split, dc.root, dc.download)
        if kind != "folder":
            raise DataError(
                f"data.loader=stream reads ImageFolder layouts (<root>/train/<class>/...); {where} is "
                f"{'a packed ImageFolder' if kind == 'packed' else 'in torchvision format'}, which "
                "data.loader=memory decodes"
            )
        dirs[split] = where
    evaluate = eval_transform(dc.image_size, mean, std)
    bank = folder_split(dirs["train"], evaluate, dc.train_per_class, cfg.seed)
    test = folder_split(dirs["test"], evaluate, dc.test_per_class, cfg.seed, classes=bank.classes)
    pretrain = bank.with_transform(TwoViews(augment))  # the same (subset of) images, views instead
    log.info("data (streamed by %d workers): %d pretraining images, %d test, %d classes", dc.workers,
             len(pretrain), len(test), len(bank.classes))
    return StreamingData(pretrain, bank, test, len(bank.classes), dc.workers)
