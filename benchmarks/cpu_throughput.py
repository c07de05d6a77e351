"""Throughput ratios that sized the CPU presets, measured in one run (machines are noisy: compare ratios).

    python benchmarks/cpu_throughput.py [--threads 2] [--batch 128]

Prints image pairs/s of a training step (forward + backward + SGD, both views) for the preset encoders, the
channels_last speed-up, and the batched on-device augmentation against torchvision's per-sample pipeline.
"""

import argparse
import time

import torch
from torchvision.transforms import v2

from dcl_core.data import ViewAugmentation
from dcl_core.models import ProjectionHead, SSLModel, build_backbone


def step_rate(width: float, batch: int, channels_last: bool, steps: int = 3) -> float:
    backbone, dim = build_backbone("resnet18", width, "cifar")
    model = SSLModel(backbone, ProjectionHead(dim, 128, 128))
    x = torch.randn(2 * batch, 3, 32, 32)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for i in range(steps + 1):
        if i == 1:
            t0 = time.perf_counter()
        _, z = model(x)
        z.square().mean().backward()
        opt.step()
        opt.zero_grad()
    return batch * steps / (time.perf_counter() - t0)


def augmentation_ratio(batch: int, reps: int = 5) -> tuple[float, float]:
    images = torch.randint(0, 256, (batch, 3, 32, 32), dtype=torch.uint8)
    aug, gen = ViewAugmentation(32), torch.Generator().manual_seed(0)
    t0 = time.perf_counter()
    for _ in range(reps):
        aug(images, gen)
    batched = (time.perf_counter() - t0) / reps
    per_sample = v2.Compose([
        v2.RandomResizedCrop(32, scale=(0.08, 1.0), antialias=True), v2.RandomHorizontalFlip(),
        v2.RandomApply([v2.ColorJitter(0.4, 0.4, 0.4, 0.1)], p=0.8), v2.RandomGrayscale(0.2),
        v2.ToDtype(torch.float32, scale=True),
    ])
    t0 = time.perf_counter()
    for _ in range(reps):
        for img in images:
            per_sample(img), per_sample(img)
    return batched, (time.perf_counter() - t0) / reps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch", type=int, default=128)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} threads, batch {args.batch} pairs of 32x32")
    for width in (0.125, 0.25, 0.5):
        nchw = step_rate(width, args.batch, channels_last=False)
        nhwc = step_rate(width, args.batch, channels_last=True)
        print(f"resnet18 x{width:<5}  {nchw:7.0f} pairs/s NCHW  {nhwc:7.0f} pairs/s channels_last  "
              f"ratio {nhwc / nchw:4.2f}")
    batched, per_sample = augmentation_ratio(args.batch)
    print(f"augmentation of {args.batch} images into 2 views: batched {batched * 1e3:.1f} ms, "
          f"torchvision per-sample {per_sample * 1e3:.1f} ms, speed-up {per_sample / batched:.1f}x")


if __name__ == "__main__":
    main()
