"""Tests for the linear probe (dcl_core.eval.linear) and feature extraction (dcl_core.eval.features)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dcl_core.eval import LINEAR_PRESETS, LinearProtocol, extract_features, linear_probe
from dcl_core.models import build_backbone


def _clusters(
    n_per_class: int, num_classes: int, dim: int, seed: int, scale: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gaussian blobs around well-separated random centres: linearly separable with high probability."""
    g = torch.Generator().manual_seed(0)
    centers = torch.randn(num_classes, dim, generator=g) * 5.0  # same centres for every seed
    g.manual_seed(seed)
    labels = torch.arange(num_classes).repeat_interleave(n_per_class)  # (C * n,)
    features = centers[labels] + 0.5 * torch.randn(len(labels), dim, generator=g)  # (C * n, dim)
    return features * scale, labels


# ---------------------------------------------------------------------------------------------------------
# linear_probe


@pytest.mark.parametrize("batch_norm", [True, False])
@pytest.mark.parametrize("scale", [1.0, 0.01])
def test_separable_data_is_learned(batch_norm: bool, scale: float) -> None:
    x_train, y_train = _clusters(100, 4, 16, seed=1, scale=scale)
    x_test, y_test = _clusters(50, 4, 16, seed=2, scale=scale)
    result = linear_probe(
        x_train,
        y_train,
        x_test,
        y_test,
        4,
        LinearProtocol(epochs=10, batch_size=64, milestones=(6, 8), batch_norm=batch_norm),
    )
    assert set(result) == {"linear_top1", "linear_train_top1"}
    assert result["linear_top1"] >= 99.0
    assert result["linear_train_top1"] >= 99.0


def test_random_labels_give_chance_on_test() -> None:
    g = torch.Generator().manual_seed(0)
    num_classes = 4
    x_train, y_train = torch.randn(128, 64, generator=g), torch.randint(0, num_classes, (128,), generator=g)
    x_test, y_test = torch.randn(800, 64, generator=g), torch.randint(0, num_classes, (800,), generator=g)
    result = linear_probe(x_train, y_train, x_test, y_test, num_classes, LinearProtocol(epochs=20, milestones=(12, 16)))
    assert 15.0 <= result["linear_top1"] <= 35.0  # chance is 25%, std ~1.5%
    # 128 points in 64 dimensions: the probe fits the noise of the training set far above chance.
    assert result["linear_train_top1"] >= 75.0


def test_deterministic_given_seed() -> None:
    g = torch.Generator().manual_seed(0)
    x_train, y_train = torch.randn(300, 32, generator=g), torch.randint(0, 5, (300,), generator=g)
    x_test, y_test = torch.randn(200, 32, generator=g), torch.randint(0, 5, (200,), generator=g)
    losses: dict[int, list[float]] = {0: [], 1: []}
    results = []
    for run, seed in enumerate((7, 7)):
        torch.manual_seed(run)  # the global RNG must not matter
        results.append(
            linear_probe(
                x_train,
                y_train,
                x_test,
                y_test,
                5,
                LinearProtocol(epochs=4, milestones=(2,), batch_size=32),
                seed=seed,
                epoch_callback=lambda _e, stats, run=run: losses[run].append(stats["loss"]),
            )
        )
    assert results[0] == results[1]
    assert losses[0] == losses[1]
    other: list[float] = []
    linear_probe(
        x_train,
        y_train,
        x_test,
        y_test,
        5,
        LinearProtocol(epochs=4, milestones=(2,), batch_size=32),
        seed=8,
        epoch_callback=lambda _e, stats: other.append(stats["loss"]),
    )
    assert other != losses[0]


def test_multistep_milestones_applied() -> None:
    x, y = _clusters(20, 3, 8, seed=0)
    history: list[tuple[int, float]] = []
    linear_probe(
        x,
        y,
        x,
        y,
        3,
        LinearProtocol(epochs=6, lr=2.0, milestones=(2, 4)),
        epoch_callback=lambda epoch, stats: history.append((epoch, stats["lr"])),
    )
    assert [epoch for epoch, _ in history] == list(range(6))
    assert [lr for _, lr in history] == pytest.approx([2.0, 2.0, 0.2, 0.2, 0.02, 0.02])


def test_batch_of_one_is_folded_for_batchnorm() -> None:
    x, y = _clusters(11, 3, 8, seed=0)  # 33 samples, batch_size 16 -> trailing batch of 1
    result = linear_probe(x, y, x, y, 3, LinearProtocol(epochs=2, batch_size=16, milestones=()))
    assert result["linear_train_top1"] > 90.0


def test_presets() -> None:
    # DCL A.4 (OpenSelfSup): a bare linear layer, SGD lr 30, batch 256, 100 epochs, /10 at 60 and 80.
    assert LINEAR_PRESETS["paper"] == LinearProtocol(
        epochs=100, lr=30.0, batch_size=256, momentum=0.9, weight_decay=0.0, milestones=(60, 80), batch_norm=False
    )
    for name, preset in LINEAR_PRESETS.items():
        assert all(0 < m < preset.epochs for m in preset.milestones), name
    x, y = _clusters(10, 2, 4, seed=0)
    result = linear_probe(x, y, x, y, 2, LINEAR_PRESETS["smoke"])
    assert 0.0 <= result["linear_top1"] <= 100.0


def test_linear_probe_invalid_arguments() -> None:
    x, y = _clusters(5, 2, 4, seed=0)
    with pytest.raises(ValueError):
        linear_probe(x, y, x[:, :3], y, 2)
    with pytest.raises(ValueError):
        linear_probe(x, y[:-1], x, y, 2)
    with pytest.raises(ValueError, match="epochs and batch_size"):
        LinearProtocol(epochs=0)
    with pytest.raises(ValueError, match="lr must be > 0"):
        LinearProtocol(lr=0.0)


# ---------------------------------------------------------------------------------------------------------
# extract_features


def _to_float(batch: torch.Tensor) -> torch.Tensor:
    return (batch.float() / 255.0 - 0.5) / 0.25


@pytest.fixture
def small_backbone() -> nn.Module:
    torch.manual_seed(0)
    backbone, _ = build_backbone("resnet18", width=0.125)
    # Non-trivial running statistics so that train-mode and eval-mode outputs differ.
    backbone.train()
    with torch.no_grad():
        backbone(torch.randn(8, 3, 8, 8) * 3 + 1)
    return backbone


@pytest.fixture
def images() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, 256, (10, 3, 8, 8), dtype=torch.uint8, generator=g)


def test_restores_train_mode_and_uses_eval_mode(small_backbone: nn.Module, images: torch.Tensor) -> None:
    small_backbone.train()
    small_backbone.layer2.eval()  # mixed modes must be restored per module
    modes = {name: m.training for name, m in small_backbone.named_modules()}
    stats = {k: v.clone() for k, v in small_backbone.state_dict().items()}
    extract_features(small_backbone, images, _to_float, batch_size=4)
    assert {name: m.training for name, m in small_backbone.named_modules()} == modes
    # Eval mode: BatchNorm running statistics untouched.
    assert all(torch.equal(v, stats[k]) for k, v in small_backbone.state_dict().items())

    small_backbone.eval()
    extract_features(small_backbone, images, _to_float)
    assert not any(m.training for m in small_backbone.modules())


def test_unit_norm_and_matches_direct_call(small_backbone: nn.Module, images: torch.Tensor) -> None:
    small_backbone.train()
    feats = extract_features(small_backbone, images, _to_float, batch_size=4)
    assert feats.shape == (10, 64)
    assert feats.dtype == torch.float32
    assert feats.device == torch.device("cpu")
    assert torch.allclose(feats.norm(dim=1), torch.ones(10), atol=1e-5)

    small_backbone.eval()
    with torch.no_grad():
        direct = small_backbone(_to_float(images))  # (10, 64)
    assert torch.allclose(feats, F.normalize(direct, dim=1), atol=1e-5)
    raw = extract_features(small_backbone, images, _to_float, normalize=False)
    assert torch.allclose(raw, direct, atol=1e-5)
    assert not torch.allclose(raw.norm(dim=1), torch.ones(10))


def test_batching_invariance(small_backbone: nn.Module, images: torch.Tensor) -> None:
    a = extract_features(small_backbone, images, _to_float, batch_size=3)
    b = extract_features(small_backbone, images, _to_float, batch_size=512)
    assert torch.allclose(a, b, atol=1e-5)


def test_extract_features_invalid_input(small_backbone: nn.Module) -> None:
    with pytest.raises(ValueError):
        extract_features(small_backbone, torch.zeros(0, 3, 8, 8, dtype=torch.uint8), _to_float)
    with pytest.raises(ValueError):
        extract_features(small_backbone, torch.zeros(2, 3, 8, 8, dtype=torch.uint8), _to_float, batch_size=0)


def test_batch_norm_needs_two_samples_per_batch_and_labels_must_be_in_range() -> None:
    x, y = _clusters(5, 2, 4, seed=0)
    with pytest.raises(ValueError, match="2 training samples per batch"):
        linear_probe(x, y, x, y, 2, LinearProtocol(epochs=1, batch_size=1))
    # a bare layer trains on single samples
    linear_probe(x, y, x, y, 2, LinearProtocol(epochs=1, batch_size=1, batch_norm=False))
    for bad in (y - 1, y + 1):  # -1 (unlabeled) or == num_classes
        with pytest.raises(ValueError, match=r"must lie in \[0, 2\)"):
            linear_probe(x, bad, x, y, 2, LinearProtocol(epochs=1))
        with pytest.raises(ValueError, match=r"must lie in \[0, 2\)"):
            linear_probe(x, y, x, bad, 2, LinearProtocol(epochs=1))
