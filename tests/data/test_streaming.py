"""Streaming ImageFolder data (dcl_core/data/streaming.py): the same views as the batched augmentation, read
lazily by DataLoader workers, reproducibly, and end to end through the trainer."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from dcl_core.config import ConfigError, apply_overrides, preset
from dcl_core.data import ViewAugmentation
from dcl_core.data.augment import ViewPolicy
from dcl_core.data.streaming import TwoViews, epoch_loader, eval_transform, folder_split, view_transform
from dcl_core.training import train
from dcl_core.training import trainer as trainer_module

CLASSES = ("ant", "bee", "cat")


def write_folder(root: Path, per_class: int, size: tuple[int, int] = (40, 48), seed: int = 0) -> None:
    """root/{train,val}/<class>/<i>.png with random pixels (train: per_class, val: 2 per class)."""
    rng = np.random.default_rng(seed)
    for split, n in (("train", per_class), ("val", 2)):
        for c in CLASSES:
            (root / split / c).mkdir(parents=True)
            for i in range(n):
                pixels = rng.integers(0, 256, size=(size[0], size[1], 3), dtype=np.uint8)
                Image.fromarray(pixels).save(root / split / c / f"{i}.png")


def _pil(seed: int, size: int = 32) -> Image.Image:
    pixels = np.random.default_rng(seed).integers(0, 256, size=(size, size, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


@pytest.mark.parametrize("forced", [
    {},  # crop of the whole image, nothing else
    {"flip_p": 1.0},
    {"gray_p": 1.0},
    {"solarize_p": 1.0},
    {"flip_p": 1.0, "gray_p": 1.0, "solarize_p": 1.0},
])
def test_a_streamed_view_equals_the_batched_view_when_the_draws_are_forced(forced):
    """With every random choice pinned (a full-image crop, each step applied with probability 0 or 1), the
    per-sample torchvision pipeline and the batched on-device augmentation make the same view."""
    policy = ViewPolicy(crop_scale=(1.0, 1.0), crop_ratio=(1.0, 1.0), flip_p=0.0, jitter_p=0.0, gray_p=0.0)
    policy = replace(policy, **forced)
    augment = ViewAugmentation(32)
    image = _pil(3)
    streamed = view_transform(policy, 32, augment.blur_kernel_size, augment.mean, augment.std)(image)  # (3, S, S)
    batch = torch.from_numpy(np.array(image)).permute(2, 0, 1)[None]  # (1, 3, S, S) uint8
    batched = augment.apply_policy(batch, torch.Generator().manual_seed(0), policy)[0]
    torch.testing.assert_close(streamed, batched, atol=1e-5, rtol=1e-5)


def test_two_views_follow_the_policies_and_eval_is_resize_then_center_crop():
    augment = ViewAugmentation(32, policy="byol")
    views = TwoViews(augment)
    v1, v2 = views(_pil(1, size=64))
    assert v1.shape == v2.shape == (3, 32, 32) and v1.dtype == torch.float32
    # BYOL's asymmetry: blur always on view 1, solarize only on view 2.
    names = [[type(t).__name__ for t in v.transforms] for v in views.views]
    assert "RandomSolarize" not in names[0] and "RandomSolarize" in names[1]
    # ImageNet's evaluation: shorter side to size / 0.875, then the center crop.
    out = eval_transform(224, augment.mean, augment.std)(Image.new("RGB", (512, 300)))
    assert out.shape == (3, 224, 224)


def test_folder_split_subset_and_epoch_batches_are_reproducible(tmp_path):
    write_folder(tmp_path, per_class=5)
    views = TwoViews(ViewAugmentation(32))
    split = folder_split(tmp_path / "train", views, per_class=3, seed=0)
    assert len(split) == 9 and torch.bincount(split.labels).tolist() == [3, 3, 3]
    assert split.classes == CLASSES
    # The evaluation view of the same subset, without rescanning: same images, other transform.
    evaluate = split.with_transform(eval_transform(32, (0.5,) * 3, (0.25,) * 3))
    assert torch.equal(evaluate.labels, split.labels) and evaluate.dataset.indices == split.dataset.indices
    assert evaluate.dataset[0][0].shape == (3, 32, 32) and isinstance(split.dataset[0][0], tuple)
    batches = [torch.tensor([0, 4, 8]), torch.tensor([1, 2, 3])]

    def epoch(seed: int, workers: int) -> list[torch.Tensor]:
        torch.manual_seed(seed)  # what the trainer does for workers=0
        gen = torch.Generator().manual_seed(seed)
        return [torch.cat(pair) for pair in epoch_loader(split, batches, workers, gen, pin=False)]

    first = epoch(0, workers=2)
    assert [b.shape for b in first] == [(6, 3, 32, 32)] * 2  # both views of 3 images per batch, in order
    for workers in (0, 2):
        assert all(torch.equal(a, b) for a, b in zip(epoch(0, workers), epoch(0, workers), strict=True))
    assert not torch.equal(epoch(0, 2)[0], epoch(1, 2)[0])
    with pytest.raises(Exception, match="unlike the train split"):
        (tmp_path / "val" / "dog").mkdir()
        Image.new("RGB", (8, 8)).save(tmp_path / "val" / "dog" / "0.png")
        folder_split(tmp_path / "val", views, classes=split.classes)


def test_stream_config():
    assert preset("paper_imagenet").data.loader == "stream"
    with pytest.raises(ConfigError, match="STL-10 comes in torchvision's binary format"):
        apply_overrides(preset("smoke"), {"data.dataset": "stl10", "data.loader": "stream"})
    with pytest.raises(ConfigError, match=r"data\.loader must be one of memory, stream"):
        apply_overrides(preset("smoke"), {"data.loader": "disk"})


@pytest.mark.slow  # two streamed training runs: ~7 s
def test_trainer_streams_an_image_folder_and_resumes_exactly(tmp_path):
    write_folder(tmp_path / "data", per_class=8)
    cfg = apply_overrides(preset("smoke"), {
        "data.dataset": "imagefolder", "data.root": str(tmp_path / "data"), "data.loader": "stream",
        "data.workers": 2, "data.train_per_class": 0, "data.test_per_class": 0, "optim.batch_size": 8,
        "optim.epochs": 2, "eval.knn_k": 5, "output_dir": str(tmp_path / "straight"), "threads": 1,
    })
    straight = train(cfg)
    assert [m["epoch"] for m in straight.history] == [1, 2]
    assert all(np.isfinite(m["train/loss"]) and 0 <= m["eval/knn_top1"] <= 100 for m in straight.history)

    # One epoch, then resume for the second: the same losses (the workers' views are seeded per epoch).
    first = apply_overrides(cfg, {"optim.epochs": 2, "output_dir": str(tmp_path / "resumed")})

    class StopAfterFirstEpochError(Exception):
        pass

    def stop_after_first(epoch, metrics, checkpoint):
        if epoch == 1:
            raise StopAfterFirstEpochError

    with pytest.raises(StopAfterFirstEpochError):
        trainer_module.train(first, callbacks=[stop_after_first])
    resumed = train(first, resume=True)
    assert [m["train/loss"] for m in resumed.history] == [m["train/loss"] for m in straight.history]
    lines = (tmp_path / "resumed" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["epoch"] for line in lines] == [1, 2]
