"""Augmentation: our batched ``ViewAugmentation`` vs torchvision's per-sample v2 pipeline vs kornia's batched one.

All three turn a uint8 batch (B, 3, 32, 32) (B = 128, 512; ``--quick``: 128) into two float32 normalized views
with the CIFAR "simclr" policy that ``ViewAugmentation(32)`` applies: RandomResizedCrop(32, scale=(0.08, 1),
ratio=(3/4, 4/3)), horizontal flip p=0.5, ColorJitter(0.4, 0.4, 0.4, 0.1) with p=0.8, grayscale p=0.2, CIFAR
mean/std normalization (no blur or solarization at 32 px).

* torchvision: ``transforms.v2`` applied image by image (what a Dataset's ``__getitem__`` does), both views,
  then stacked as a DataLoader's collate would.
* kornia: ``kornia.augmentation.AugmentationSequential`` on the whole float batch, once per view.

Reading a row: ``ours`` and ``baseline`` are milliseconds per batch (two views); ``ratio`` = baseline / ours
time, i.e. how many times faster ours is. Goal vs torchvision: ratio ≥ 3. Ours vs kornia is informational. All
sides run in this process with the same torch thread count.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from benchmarks.common import Row, bench_extra, interleaved, speedup_row

SECTION = "augmentation"
SIZE = 32
KORNIA_FIDELITY = (
    "kornia draws from the global RNG (no per-call generator, so views are not reproducible across devices) "
    "and its resized crop maps the box's corner pixels onto the output's (align_corners=True) rather than "
    "torchvision's crop-then-resize; ours follows torchvision's sampling and resampling"
)


def _ours() -> Callable[[torch.Tensor], object]:
    from dcl_core.data import ViewAugmentation

    aug, gen = ViewAugmentation(SIZE), torch.Generator().manual_seed(0)
    return lambda images: aug(images, gen)


def _torchvision() -> Callable[[torch.Tensor], object]:
    from torchvision.transforms import v2

    from dcl_core.data.augment import CIFAR_MEAN, CIFAR_STD

    per_sample = v2.Compose([
        v2.RandomResizedCrop(SIZE, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3), antialias=True),
        v2.RandomHorizontalFlip(0.5),
        v2.RandomApply([v2.ColorJitter(0.4, 0.4, 0.4, 0.1)], p=0.8),
        v2.RandomGrayscale(0.2),
        v2.ToDtype(torch.float32, scale=True),
        v2.Normalize(list(CIFAR_MEAN), list(CIFAR_STD)),
    ])

    def run(images: torch.Tensor) -> object:
        views = [(per_sample(img), per_sample(img)) for img in images]
        return torch.stack([v[0] for v in views]), torch.stack([v[1] for v in views])

    return run


def _kornia() -> Callable[[torch.Tensor], object]:
    K = bench_extra("kornia.augmentation", "augmentation", "kornia>=0.7,<1")
    from dcl_core.data.augment import CIFAR_MEAN, CIFAR_STD

    pipeline = K.AugmentationSequential(
        K.RandomResizedCrop((SIZE, SIZE), scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)),
        K.RandomHorizontalFlip(p=0.5),
        K.ColorJitter(0.4, 0.4, 0.4, 0.1, p=0.8),
        K.RandomGrayscale(p=0.2),
        K.Normalize(mean=torch.tensor(CIFAR_MEAN), std=torch.tensor(CIFAR_STD)),
    )

    def run(images: torch.Tensor) -> object:
        with torch.no_grad():
            x = images.to(torch.float32) / 255.0
            return pipeline(x), pipeline(x)

    return run


def run(quick: bool) -> list[Row]:
    """Per batch size: ours vs torchvision (goal ≥ 3× faster) and ours vs kornia (informational)."""
    ours, torchvision, kornia = _ours(), _torchvision(), _kornia()
    threads = torch.get_num_threads()
    rows = []
    for batch in (128,) if quick else (128, 512):
        images = torch.randint(0, 256, (batch, 3, SIZE, SIZE), dtype=torch.uint8,
                               generator=torch.Generator().manual_seed(batch))
        reps = 3 if quick else 7
        t_ours, t_tv = interleaved(lambda x=images: ours(x), lambda x=images: torchvision(x), reps=reps)
        rows.append(speedup_row(
            SECTION, f"two views of B={batch} CIFAR images, ours vs torchvision v2 per-sample", t_ours, t_tv,
            goal=">= 3x torchvision's speed (torchvision/ours time)", at_least=3.0,
            note=f"{threads} threads, torchvision per image then stacked",
        ))
        t_ours, t_kornia = interleaved(lambda x=images: ours(x), lambda x=images: kornia(x), reps=2 * reps)
        faster = "kornia is faster" if t_kornia < t_ours else "ours is faster"
        rows.append(speedup_row(
            SECTION, f"two views of B={batch} CIFAR images, ours vs kornia AugmentationSequential", t_ours, t_kornia,
            goal="", at_least=None, note=f"{faster}; fidelity: {KORNIA_FIDELITY}",
        ))
    return rows
