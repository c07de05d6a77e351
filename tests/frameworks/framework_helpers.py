"""Shared pieces of the framework tests: a tiny encoder, a loss that records its similarities, a training driver."""

from __future__ import annotations

import functools
import math

import torch
from cifar10_present import cifar10_present
from torch import Tensor, nn

from dcl_core.data import load_dataset
from dcl_core.losses import LOSSES, ContrastiveLoss, EqCoLoss, InfoNCELoss, LossOutput, PairSimilarities

IMAGE = (3, 4, 4)  # tiny "images" for unit tests
PAIR_LOSSES = ("infonce", "dcl", "dclw", "dclw_exp", "eqco")  # every loss with a from_similarities form


class TinyEncoder(nn.Module):
    """(B, 3, H, W) -> (features (B, F), projections (B, P)), the SSLModel interface, in a few hundred weights."""

    def __init__(self, in_dim: int = 48, feat_dim: int = 16, proj_dim: int = 8, bn: bool = True) -> None:
        super().__init__()
        self.backbone = nn.Sequential(
            nn.Flatten(),  # (B, in_dim)
            nn.Linear(in_dim, feat_dim),
            nn.BatchNorm1d(feat_dim) if bn else nn.Identity(),
            nn.ReLU(),
        )
        self.head = nn.Sequential(nn.Linear(feat_dim, feat_dim), nn.ReLU(), nn.Linear(feat_dim, proj_dim))

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        h = self.backbone(x)  # (B, F)
        return h, self.head(h)  # (B, F), (B, P)


class SpyLoss(ContrastiveLoss):
    """InfoNCE that keeps the last :class:`PairSimilarities` it was given."""

    def __init__(self, temperature: float = 0.2) -> None:
        super().__init__(temperature)
        self.inner = InfoNCELoss(temperature)
        self.sims: PairSimilarities | None = None

    def from_similarities(self, sims: PairSimilarities) -> LossOutput:
        self.sims = sims
        return self.inner.from_similarities(sims)


def make_views(n: int, seed: int = 0) -> tuple[Tensor, Tensor]:
    """Two (n, 3, 4, 4) views: a shared base plus independent noise."""
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(n, *IMAGE, generator=g)
    return base + 0.3 * torch.randn(n, *IMAGE, generator=g), base + 0.3 * torch.randn(n, *IMAGE, generator=g)


def make_loss(name: str, temperature: float = 0.2) -> ContrastiveLoss:
    """A pair loss by name; EqCo with α = 256 (SiMo's setting, EqCo Table 2) so it differs from InfoNCE."""
    if name == "eqco":
        return EqCoLoss(temperature=temperature, alpha=256.0)
    return LOSSES[name](temperature=temperature)


def cifar_available() -> bool:
    return cifar10_present()


@functools.cache
def cifar_pool(per_class: int = 20, size: int = 8) -> Tensor:
    """Class-balanced embedded CIFAR-10 train images, standardized, downsampled to (M, 3, size, size); cached."""
    images = load_dataset("cifar10", "train", per_class=per_class, seed=0).images  # uint8 (M, 3, 32, 32)
    x = images.float() / 255.0
    x = nn.functional.avg_pool2d(x, 32 // size)  # (M, 3, s, s)
    return (x - x.mean(dim=(0, 2, 3), keepdim=True)) / x.std(dim=(0, 2, 3), keepdim=True)


def augment(batch: Tensor, g: torch.Generator) -> Tensor:
    """A cheap stochastic view: random horizontal flip, per-image brightness/contrast jitter, pixel noise."""
    n = batch.shape[0]
    flip = torch.rand(n, generator=g) < 0.5  # (n,)
    x = torch.where(flip[:, None, None, None], batch.flip(-1), batch)  # (n, 3, s, s)
    scale = 1.0 + 0.2 * (torch.rand(n, 1, 1, 1, generator=g) - 0.5)  # (n, 1, 1, 1)
    shift = 0.2 * (torch.rand(n, 1, 1, 1, generator=g) - 0.5)  # (n, 1, 1, 1)
    return x * scale + shift + 0.1 * torch.randn(x.shape, generator=g)


def train_losses(
    framework: nn.Module, model: nn.Module, pool: Tensor, steps: int, batch: int = 32, lr: float = 0.05, seed: int = 0
) -> list[float]:
    """Drive ``framework`` like the trainer (forward, backward, SGD step, after_step) on random batches of ``pool``."""
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    framework.train()
    losses = []
    for _ in range(steps):
        idx = torch.randperm(pool.shape[0], generator=g)[:batch]
        x = pool[idx]
        out = framework(augment(x, g), augment(x, g))
        assert math.isfinite(out.loss.item())
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        opt.step()
        framework.after_step()
        losses.append(out.loss.item())
    return losses


def smoke_overrides(tmp_path, **overrides) -> dict:
    """The ``smoke`` preset's run in ``tmp_path`` with 2 threads, plus ``overrides`` (dotted keys)."""
    return {"output_dir": str(tmp_path / "run"), "threads": 2, **overrides}
